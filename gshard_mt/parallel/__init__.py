"""Partitioning over a device mesh: `mesh`, `rules` (logical axes -> mesh axes), `shardings`, `distributed`."""
