"""What only a TPU would run, kept out of the default paths: `kernels` (Pallas kernels for TPUs, each imported only
when its option asks: model.attention, moe.expert_kernel, optimizer.kernel, optimizer.loss_kernel = 'pallas') and
`estimates` (the TPU compiler on any machine: compile-only devices, the compiler's costs, a roofline per
instruction, the parts of a step; used by the dry run and bench/). Every kernel here is compiled by libtpu and
tested in Pallas's interpret mode on the CPU; none has run or been timed on a TPU."""
