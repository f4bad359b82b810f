"""The keys of a batch, which the data pipeline writes, the model reads and the mesh shards: `inputs` [B, Ls] and
`targets` [B, Lt] int32 token ids, and for each its `_segmentation` (1, 2, ... for the pairs packed into a row, 0
for padding) and `_position` (the position within its own pair)."""

FIELDS = ("inputs", "targets")
BATCH_KEYS = tuple(f"{f}{suffix}" for f in FIELDS for suffix in ("", "_segmentation", "_position"))
SOURCE_KEYS = BATCH_KEYS[:3]  # what encoding (and so decoding) reads
