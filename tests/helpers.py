"""What the tests share besides fixtures: the repository root and a small config that compiles in seconds."""

import os
import pathlib
import sys

from gshard_mt import cli, config_files, xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
LANGUAGES = "fra,deu,spa,ell,kab"
# configs/tiny.py shrunk to compile and run in seconds on a CPU: the overrides of `small_config`, and of the
# command lines of the tests that start train.py (`small_args`).
SMALL = {"batch_size": "8", "num_train_steps": "6", "log_every": "1", "eval_every": "0", "eval_bleu_every": "0",
         "eval_batches": "2", "checkpoint_every": "3", "data.languages": LANGUAGES, "data.vocab_size": "600",
         "data.max_length": "24", "data.max_target_length": "0", "model.emb_dim": "32", "model.num_heads": "2",
         "model.head_dim": "16", "model.mlp_dim": "64", "moe.num_experts": "4", "moe.hidden_dim": "64",
         "moe.group_size": "64", "data.prefetch": "1"}


def small_overrides(**overrides) -> dict[str, str]:
  return {**SMALL, **{k: str(v) for k, v in overrides.items()}}


def small_config(**overrides):
  """configs/tiny.py with the SMALL overrides (and these)."""
  return cli.load(ROOT / "configs" / "tiny.py", small_overrides(**overrides))


def small_args(**overrides) -> list[str]:
  """The same config as `small_config(**overrides)`, as train.py's `--config.key=value` arguments."""
  return [f"--config.{k}={v}" for k, v in small_overrides(**overrides).items()]


def started_as(monkeypatch, argv: list[str], *, make: bool = False):
  """This process as if started by `argv` (['python', 'train.py', ...]), through make (MAKELEVEL set) or not: what
  `gshard_mt.hints` reads to write a message's command."""
  monkeypatch.setattr(sys, "orig_argv", list(argv))
  monkeypatch.setattr(sys, "argv", argv[2:] if argv[1] == "-m" else argv[1:])
  if make:
    monkeypatch.setenv("MAKELEVEL", "1")
  else:
    monkeypatch.delenv("MAKELEVEL", raising=False)


def fresh_env(**extra) -> dict[str, str]:
  """The environment for a subprocess as a fresh shell gives it: without the libtpu host variables that any
  in-process `cli.run` or TPU compile of this test session sets (`xla_flags.quiet_tpu_host_lookup`), which would hide
  the warnings libtpu prints where a program does not set them itself."""
  env = {k: v for k, v in os.environ.items() if k not in xla_flags.TPU_HOST_VARIABLES}
  return {**env, **extra}


def run_on_cpu_devices(module: str, function: str, devices: int = 4):
  """Runs `module.function()` in a fresh process with `devices` CPU devices (JAX fixes the count at start); the
  function prints OK when its checks pass."""
  import subprocess
  import sys

  env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), PYTHONPATH=str(ROOT))
  code = f"from {module} import {function}; {function}()"
  proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-2000:] + proc.stderr[-3000:]


def initialised_run(workdir, tokenizer_dir, **config_json):
  """A work directory (with the session's tokenizer) holding the checkpoint, at step 1, of an initialised model of
  `small_config()`: what eval.py and translate.py need, without compiling a train step. `config_json` overrides
  keys of the saved config.json only (e.g. a mesh the test process has not the devices for)."""
  import shutil

  from gshard_mt.data import pipeline
  from gshard_mt.training import checkpoint as checkpoint_lib
  from gshard_mt.training.setup import build

  shutil.copytree(tokenizer_dir, workdir / "tokenizer")
  config = small_config()
  data = pipeline.load(config, workdir)
  state = build(config, data.tokenizer.vocab_size).init_state(config.seed)
  with checkpoint_lib.Checkpoints(workdir / "checkpoints", async_save=False) as ckpts:
    ckpts.save(1, state, {"seed": 0, "next_index": 0}, force=True)
  config_files.save(small_config(**config_json), workdir)
  return workdir
