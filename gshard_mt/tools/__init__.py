"""Commands: translation of arbitrary lines, the dry run, the sharding report, sweeps and studies, plots, data
preparation and inspection. What they read compiled programs with is in `gshard_mt.tpu.estimates`."""
