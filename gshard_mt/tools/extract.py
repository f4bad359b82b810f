"""A smaller model for some source languages, from a model trained with task-level routing (moe.router='language').

  python -m gshard_mt.tools.extract --workdir runs/x --languages fra [--step N] [--output runs/x-fra]
  python eval.py --workdir runs/x-fra --languages fra          # translate.py loads it too

With moe.router='language' every token of a sentence goes to the top-k experts of its source language (Kudugunta
et al. 2021, "Beyond Distillation", section 3): a language uses k experts per MoE layer, so the experts no chosen
language uses can be left out. The output work directory holds a checkpoint (of `--step`, default the newest) with
only those experts in each MoE layer (E' = the most any layer keeps; a layer that keeps fewer keeps some unused
ones too, as the layers of a scanned stack share one shape), its config.json (moe.num_experts = E', the data read
from the original's prepared corpus) and extracted.json (the experts kept per layer). For its languages it gives
the same translations as the full model; serving one language then costs what a dense model of k experts costs.
A run trained with moe.balance='bias' is refused: its experts are the top-k of softmax + bias, which a softmax over
fewer experts may change.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from gshard_mt import cli, io
from gshard_mt import config as config_lib
from gshard_mt.data import prepare as prepare_lib
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.model.transformer import EMBEDDING_SCHEMES
from gshard_mt.moe import balance, gating
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import validate
from gshard_mt.training.setup import build
from gshard_mt.training.step import TrainState


def language_vectors(params: dict, model_cfg, tags: list[int]) -> np.ndarray:
  """[languages, M]: what the language router reads for each tag id, as `Transformer` computes it (the source
  embedding of the tag times the input multiplier of the embedding scheme)."""
  scale = model_cfg.emb_dim ** EMBEDDING_SCHEMES[model_cfg.embedding][1]
  return np.asarray(params["embed"]["embedding"])[tags] * scale


def chosen_experts(moe: dict, vectors: np.ndarray, moe_cfg) -> np.ndarray:
  """bool [..., E]: the experts some language chooses in a MoE layer's parameters `moe` (wg [..., M, E], optional
  router bias [..., E]; `...` the scanned units), by the router's own rule: the top-k of softmax(logits) + bias."""
  logits = gating.cap_logits(jnp.einsum("LM,...ME->...LE", vectors, moe["wg"]), moe_cfg.router_logit_cap)
  bias = moe.get(balance.NAME)
  experts, _ = gating.choices_of(jax.nn.softmax(logits, axis=-1), moe_cfg.num_selected,
                                 None if bias is None else bias[..., None, :])
  E = moe["wg"].shape[-1]
  return np.asarray(jax.nn.one_hot(jnp.stack(experts, -1), E, dtype=jnp.int32).sum(axis=(-3, -2)) > 0)


def kept_experts(chosen: list[np.ndarray]) -> tuple[int, list[np.ndarray]]:
  """(E', int [..., E'] per layer): each layer's chosen experts, topped up with its lowest unchosen ones to the
  most any layer chose, in ascending order (the order ties are broken in, so the same experts win)."""
  count = max(int(c.sum(-1).max()) for c in chosen)
  # chosen ones first (stable: ascending within each), then the first unchosen ones, then sorted back
  return count, [np.sort(np.argsort(~c, axis=-1, kind="stable")[..., :count], axis=-1) for c in chosen]


def extract_params(params: dict, model_cfg, tags: list[int]) -> tuple[dict, int, dict]:
  """(params with each MoE layer cut to its kept experts, E', {layer path: kept experts}) for the languages whose
  tag ids are `tags`."""
  flat = traverse_util.flatten_dict(params)
  layers = sorted({path[:-1] for path in flat if path[-2:-1] == ("moe",) and path[-1] == "wg"})
  vectors = language_vectors(params, model_cfg, tags)
  chosen = [chosen_experts({k[-1]: np.asarray(v) for k, v in flat.items() if k[:-1] == layer}, vectors, model_cfg.moe)
            for layer in layers]
  count, kept = kept_experts(chosen)
  for layer, keep in zip(layers, kept):
    lead = keep.ndim - 1  # the scanned units' axis, or none
    for name, axis in (("wg", lead + 1), ("wi", lead), ("wo", lead), (balance.NAME, lead)):
      if layer + (name,) in flat:
        value = np.asarray(flat[layer + (name,)])
        index = np.expand_dims(keep, tuple(range(lead + 1, value.ndim)) if axis == lead else lead)
        flat[layer + (name,)] = np.take_along_axis(value, index, axis=axis)
  return traverse_util.unflatten_dict(flat), count, {"/".join(layer): k.tolist() for layer, k in zip(layers, kept)}


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("--workdir", required=True, help="a run trained with moe.router='language'")
  parser.add_argument("--languages", required=True, help="comma-separated source languages to keep, e.g. fra,deu")
  parser.add_argument("--step", type=int, default=None, help="the checkpoint (default: the newest)")
  parser.add_argument("--output", default=None, help="default: <workdir>-<languages joined by '-'>")
  args = parser.parse_args(argv)
  languages = [lang.strip() for lang in args.languages.split(",") if lang.strip()]
  output = io.path(args.output or f"{str(args.workdir).rstrip('/')}-{'-'.join(languages)}")
  config = config_lib.load_saved(args.workdir, validate.check)
  io.check_writable(output, "output work directory", create=False)  # before the checkpoint and data are read
  if (output / checkpoint_lib.FOLDER).is_dir() and any((output / checkpoint_lib.FOLDER).iterdir()):
    raise WorkdirError(f"{output}: holds checkpoints already (an earlier extraction?); remove it or pass --output")
  routers_used = {config.moe.router, config.moe.decoder_router or config.moe.router}
  if not config.model.moe_interval or routers_used != {"language"}:
    raise WorkdirError(f"{args.workdir}: extraction needs a MoE model routed by language in the encoder and the "
                       f"decoder (moe.router='language'); this one has {sorted(routers_used)}")
  if config.moe.balance == "bias":
    raise WorkdirError(f"{args.workdir}: trained with moe.balance='bias', whose experts are the top-k of softmax "
                       "+ bias: a model of fewer experts may choose others, so extraction would not be exact")
  run = evaluate.restore(args.workdir, step=args.step)
  tags = [run.data.tokenizer.tag_id(lang) for lang in languages]
  if None in tags:
    unknown = [lang for lang, tag in zip(languages, tags) if tag is None]
    raise WorkdirError(f"{args.workdir}: no source-language tag for {unknown} in its vocabulary")
  params, count, kept = extract_params(jax.device_get(run.params), run.model_cfg, tags)
  prepared = str(prepare_lib.root(config.data, args.workdir))  # the same corpus and tokenizer
  config = config_lib.replace(config, {"moe.num_experts": count, "data.prepared_dir": prepared if "://" in prepared
                                       else os.path.abspath(prepared)})
  config_lib.save(config, output)
  setup = build(config, run.data.tokenizer.vocab_size)
  params = jax.device_put(params, setup.state_shardings.params)
  state = TrainState(step=jnp.asarray(run.step, jnp.int32), params=params, opt_state=jax.jit(setup.tx.init)(params),
                     rng=jax.random.key_data(jax.random.key(config.seed)))
  with checkpoint_lib.Checkpoints(output / checkpoint_lib.FOLDER, async_save=False) as ckpts:
    ckpts.save(run.step, state, {"seed": config.data.seed, "next_index": 0}, force=True)
  io.write_atomically(output / "extracted.json", json.dumps(
      {"from": str(args.workdir), "step": run.step, "languages": languages, "num_experts": count, "kept": kept},
      indent=2))
  print(f"wrote {output}: {count} of {run.model_cfg.moe.num_experts} experts per MoE layer for {', '.join(languages)}")


if __name__ == "__main__":
  cli.run(main, prog="python -m gshard_mt.tools.extract")
