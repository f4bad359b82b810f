"""One process of a two-process run (jax.distributed on localhost) that gets its data as train.py does
(`loop.prepare`: process 0 prepares the corpus while the other waits) and saves the rows it builds of batches 0-2.

  python tests/integration/prepared_worker.py PORT PROCESS_ID WORKDIR PREPARED_DIR OUT.npz
"""

import sys

from gshard_mt import cli


def main(port, process_id, workdir, prepared_dir, out):
  cli.setup_logging()  # before JAX is imported, as train.py does: INFO lines say whether this process prepared
  import jax
  import numpy as np

  from gshard_mt.training import loop
  from tests.helpers import small_config

  jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=int(process_id))
  config = small_config(**{"data.prepared_dir": prepared_dir, "moe.group_size": 48})  # 4 groups over 2 devices
  data = loop.prepare(config, workdir)
  batches = data.train_batches(config, jax.process_index(), jax.process_count())
  np.savez(out, directory=str(data.directory), **{f"{i}/{k}": v for i in range(3) for k, v in batches.batch(i).items()})


if __name__ == "__main__":
  main(*sys.argv[1:])
