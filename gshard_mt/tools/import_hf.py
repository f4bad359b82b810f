"""A work directory from a transformers checkpoint of NLLB-200 (M2M100) or NLLB-MoE (NllbMoe).

  python -m gshard_mt.tools.import_hf --from DIR --workdir runs/nllb [--config configs/nllb.py] [--config.k=v]
  python translate.py --workdir runs/nllb --source_lang fra      # eval.py and train.py read it as they are

DIR is what transformers' save_pretrained writes (config.json, model.safetensors or its shards with their index,
sentencepiece.bpe.model and the tokenizer's files), or a hub name (facebook/nllb-200-distilled-600M) fetched with
huggingface_hub where it is installed and the network reaches the hub. The work directory gets config.json (the
--config file's data, training and optimizer keys; the model's from the checkpoint, in float32), the tokenizer
(hf_tokenizer/, data.tokenizer) and a step-0 checkpoint with a fresh optimizer. The tensors are read one at a time
from their memory maps (no torch), each leaf sent to its devices when complete.
"""

from __future__ import annotations

import json
import resource
import time

import jax

from gshard_mt import cli, config_files, io
from gshard_mt import config as config_lib
from gshard_mt.data import nllb, tokenizer_files
from gshard_mt.errors import UserError, WorkdirError, one_line
from gshard_mt.hf import configs, convert, safetensors
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import validate
from gshard_mt.training.setup import build

TOKENIZER = "hf_tokenizer"  # in the work directory


def local_copy(source: str) -> io.epath.Path:
  """`source` as a local directory: itself, or a hub name's snapshot (huggingface_hub, where installed)."""
  path = io.path(source)
  if path.is_dir():
    return path
  if source.count("/") != 1 or path.exists():
    raise UserError(f"--from {source}: no such directory (nor a hub name like facebook/nllb-200-distilled-600M)")
  try:
    import huggingface_hub  # optional dependency: only for hub names
  except ImportError:
    raise UserError(f"--from {source}: not a local directory, and fetching it needs huggingface_hub "
                    "(pip install huggingface_hub); or save_pretrained it and pass the directory") from None
  try:
    return io.path(huggingface_hub.snapshot_download(source, allow_patterns=["*.json", "*.safetensors", "*.model"]))
  except Exception as e:  # noqa: BLE001 - no network, an unknown name, a gated model: one line each
    raise UserError(f"--from {source}: cannot be fetched from the hub ({one_line(e)})") from None


def imported_config(args, overrides: dict, source: io.epath.Path, workdir: io.epath.Path):
  """The run's config: --config with its overrides, the checkpoint's model keys and its tokenizer, validated."""
  where = source / "config.json"
  if not where.is_file():
    raise WorkdirError(f"{where}: not found: --from must be what transformers' save_pretrained writes")
  try:
    hf = json.loads(where.read_text())
  except ValueError as e:
    raise WorkdirError(f"{where}: not JSON ({e})") from None
  if not tokenizer_files.is_nllb(source):
    raise WorkdirError(f"{source}: no NLLB tokenizer ({nllb.MODEL} and {nllb.CONFIG})")
  config = config_lib.replace(cli.load(args.config, overrides),
                              configs.overrides(hf, str(where)) | {"data.tokenizer": str(workdir / TOKENIZER)})
  return validate.check(config), hf


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("--from", dest="source", required=True, help="a save_pretrained directory, or a hub name")
  parser.add_argument("--workdir", required=True, help="the new work directory")
  parser.add_argument("--config", default="configs/nllb.py", help="its data, training and optimizer keys")
  rest, overrides = config_lib.split_overrides(argv)
  args = parser.parse_args(rest)
  workdir, source = io.path(args.workdir), local_copy(args.source)
  io.check_writable(workdir, "work directory", create=False)
  if (workdir / checkpoint_lib.FOLDER).is_dir() and any((workdir / checkpoint_lib.FOLDER).iterdir()):
    raise WorkdirError(f"{workdir}: holds checkpoints already; import into a new work directory")
  config, hf = imported_config(args, overrides, source, workdir)
  checkpoint = safetensors.open(source)  # the headers: a bad file fails here, before anything is written
  start = time.perf_counter()
  staged = workdir / f"{TOKENIZER}.tmp"
  io.remove_tree(staged)
  staged.mkdir(parents=True)
  tokenizer_files.copy_into(source, staged)
  io.remove_tree(workdir / TOKENIZER)
  staged.rename(workdir / TOKENIZER)
  tokenizer = tokenizer_files.load(workdir / TOKENIZER)
  setup = build(config, tokenizer)
  state = convert.import_state(setup, checkpoint.tensors(), hf["model_type"], config.seed)
  reading = peak_memory()
  config_files.save(config, workdir)
  with checkpoint_lib.Checkpoints(workdir / checkpoint_lib.FOLDER, async_save=False) as ckpts:
    ckpts.save(0, state, {"seed": config.data.seed, "next_index": 0}, force=True)
  count = sum(x.size for x in jax.tree.leaves(state.params))
  print(f"wrote {workdir}: {hf['model_type']} with {count:,} parameters ({len(checkpoint.names())} tensors) at step "
        f"0, its tokenizer in {workdir / TOKENIZER}, in {time.perf_counter() - start:.1f} s; peak memory "
        f"{reading / 2**30:.2f} GiB reading it, {peak_memory() / 2**30:.2f} GiB saving it")


def peak_memory() -> int:
  """This process's peak resident memory in bytes (Linux's getrusage counts KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
  cli.run(main)
