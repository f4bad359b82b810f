"""How a step's batch splits: rows per microbatch, tokens per row, and the MoE groups of S tokens that a
microbatch's tokens make (GShard section 2.2: group-local dispatch), with why a group size fails."""

from __future__ import annotations

LENGTH_KEYS = ("data.max_length", "data.max_target_length")  # the row lengths of `row_lengths`, in order


def microbatch_rows(config) -> int:
  """Rows of one microbatch: what each forward and backward pass of a training step sees."""
  return config.batch_size // config.num_microbatches


def row_lengths(config) -> tuple[int, int]:
  """(source, target) tokens per training row (max_target_length 0 = max_length). Sources take ~1.6x the tokens of
  their English targets, so equal lengths leave target slots empty."""
  return config.data.max_length, config.data.max_target_length or config.data.max_length


def moe_group_error(config, group_devices: int = 1, group_size: int | None = None) -> str | None:
  """Why the MoE groups of S tokens (`group_size`, default moe.group_size) fail, in one line, or None. Each side's
  tokens must be whole groups (without microbatches, fewer tokens make one group) that split over `group_devices`,
  the devices of the mesh axes the rules give 'group'."""
  if not config.model.moe_interval:
    return None
  size, micro = group_size or config.moe.group_size, config.num_microbatches > 1
  batch, rows = ("microbatch", "batch_size / num_microbatches") if micro else ("batch", "batch_size")
  for key, length in zip(LENGTH_KEYS, row_lengths(config)):
    tokens = microbatch_rows(config) * length
    if tokens % size and (tokens > size or micro):
      return (f"moe.group_size={size} does not divide the {tokens} tokens of a {batch} "
              f"(batch_size={config.batch_size}{f' / num_microbatches={config.num_microbatches}' * micro} x "
              f"{key}={length})")
    if (groups := max(tokens // size, 1)) % group_devices:
      return (f"the {groups} MoE groups of a {batch} ({rows} x {key}={length} / moe.group_size) do not split "
              f"over the {group_devices} devices of the mesh axes the groups are split over; lower moe.group_size "
              "or raise batch_size")
  return None
