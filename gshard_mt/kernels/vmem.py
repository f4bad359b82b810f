"""What the Pallas attention kernels (`pallas_attention`) hold in VMEM, the rows per block that fit a TPU, and
whether they fit at all: `options` checks it before compiling (docs/decisions.md).
Letters as in `layers`: Q, K positions, M model dim, A·D the heads' width. Also
Mosaic's rule for the row blocks of the other kernels (`divisor_rows`).
"""

from __future__ import annotations

ROWS = (8, 4, 2, 1)  # rows per kernel block, the most that fits (`block_rows`)
VMEM_LIMIT = 48 * 2**20  # the kernels' scoped VMEM at most (the compiler's default is 16 MiB)
SPARE = 0.9  # `vmem_bytes` is within a few per cent of the compiler's figure: a tenth of the VMEM kept spare


def vmem_bytes(rows: int, Q: int, K: int, M: int, AD: int, residual: int, itemsize: int) -> int:
  """The backward kernel's VMEM (the larger of the two) with blocks of `rows` rows, for a residual stream of
  `residual` bytes per number and a computation dtype of `itemsize`, as its buffers add up: the weights and the
  float32 partials of their gradients, one buffer each; two buffers of each block of x and dy in and of dx out,
  and of kv in and dkv out; the float32 cotangent of kv (or of the normalized rows); the float32 scratch o, dq, dk,
  dv; q, k, v, do and the float32 products they come from. Checked against the compiler's figures
  (tests/unit/test_pallas_attention.py), which it exceeds by at most a tenth or falls short of by less than SPARE
  leaves."""
  per_row = (2 * (3 * Q + 2 * K) * M * itemsize + 4 * Q * M * (residual - itemsize) + 4 * K * M
             + 2 * (Q + K) * AD * (8 + itemsize))
  return 4 * M * AD * (itemsize + 4) + rows * per_row


def divisor_rows(S: int, total: int, cap: int) -> int | None:
  """The most rows T <= cap per block of a kernel over rows in runs of S (a block within one run): a divisor of
  S that is a multiple of 8 or all `total` rows (Mosaic's block rule); None where there is none."""
  return next((t for t in range(min(S, cap), 0, -1) if S % t == 0 and (t % 8 == 0 or t == total)), None)


def vmem_budget(vmem: int | None) -> int:
  """What the kernels may hold in VMEM on a TPU with `vmem` bytes of it (None: not known, VMEM_LIMIT)."""
  return min(vmem or VMEM_LIMIT, VMEM_LIMIT)


def block_rows(Q: int, K: int, M: int, AD: int, residual: int, itemsize: int, vmem: int | None) -> int:
  """Rows per block: the most of ROWS whose kernels fit `vmem_budget(vmem)`, else 1 (which the training setup
  refuses beforehand: `tpu_problem`)."""
  fits = lambda r: vmem_bytes(r, Q, K, M, AD, residual, itemsize) <= SPARE * vmem_budget(vmem)  # noqa: E731
  return next((r for r in ROWS if fits(r)), 1)


def tpu_problem(vmem_capacity: int | None, lengths, M: int, AD: int, residual: int, itemsize: int) -> str | None:
  """Why the kernels would not compile for a TPU with `vmem_capacity` bytes of VMEM (None: a generation they do
  not support) at row lengths `lengths` (source, target), or None."""
  if vmem_capacity is None:
    return "its Mosaic kernels need a TPU v4 or newer"
  if any(L % 8 for L in lengths):
    return f"its kernels need row lengths that are multiples of 8, not {tuple(lengths)}"
  src, tgt = lengths
  need = max(vmem_bytes(block_rows(Q, K, M, AD, residual, itemsize, vmem_capacity), Q, K, M, AD, residual, itemsize)
             for Q, K in ((src, src), (tgt, tgt), (tgt, src)))
  capacity = vmem_budget(vmem_capacity)
  if need > SPARE * capacity:
    return (f"its backward kernel needs {need / 2**20:.1f} MiB of VMEM at M={M}, A·D={AD}, rows of {src}/{tgt}, "
            f"more than the {capacity / 2**20:.0f} MiB it may use here")
  return None
