"""Command-line tools: the dry run, the sharding report, sweeps, data inspection, and reading compiled HLO."""
