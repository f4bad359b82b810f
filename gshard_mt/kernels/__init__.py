"""Pallas kernels for TPUs (interpret mode elsewhere, for tests): `attention` (model.attention='pallas'),
`expert_ffn` (moe.expert_kernel='pallas'), `adafactor` (optimizer.kernel='pallas'), `logit_stats`
(optimizer.loss_kernel='pallas'), with what they share in `pallas` and `vmem`; `options` checks those options where
the devices are known."""
