"""A smaller model for some source languages: each MoE layer cut to the experts those languages use.

  python -m gshard_mt.tools.extract --workdir runs/x --languages fra [--step N] [--output runs/x-fra]
  python -m gshard_mt.tools.extract --workdir runs/x --languages fra --keep 0.9 [--usage_split dev]
  python eval.py --workdir runs/x-fra --languages fra          # translate.py loads it too

With moe.router='language' every token of a sentence goes to the top-k experts of its source language (Kudugunta
et al. 2021, "Beyond Distillation", section 3): a language uses k experts per MoE layer, so the experts no chosen
language uses can be left out, exactly: for its languages the output gives the same translations as the full model.
A run trained with moe.balance='bias' is refused there: its experts are the top-k of softmax + bias, which a softmax
over fewer experts may change.

With a token-level router (gshard, switch, topk, dropless), language-specific pruning (Koishekenov et al. 2023,
"Memory-efficient NLLB-200"): --keep p keeps in each MoE layer the fewest experts that carry p of the languages'
assignments asked for, counted by `tools.expert_usage` on --usage_split (its expert_usage.json, measured first when
missing), and the router chooses among those only (its softmax over them). Not exact: a token whose choice was left
out goes to its best kept expert.

The output work directory holds a checkpoint (of `--step`, default the newest) with only those experts in each MoE
layer (E' = the most any layer keeps, at least k; a layer that keeps fewer keeps its next most used ones, or with
language routing its lowest unused ones, as the layers of a scanned stack share one shape), its config.json
(moe.num_experts = E', the data read from the original's prepared corpus) and extracted.json (the experts kept per
layer).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from gshard_mt import cli, config_files, io
from gshard_mt import config as config_lib
from gshard_mt.data import prepare as prepare_lib
from gshard_mt.errors import WorkdirError
from gshard_mt.evaluation import evaluate
from gshard_mt.evaluation import expert_usage as usage
from gshard_mt.model.transformer import EMBEDDING_SCHEMES
from gshard_mt.moe import balance, ffn, gating, routers
from gshard_mt.tools import expert_usage
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training import validate
from gshard_mt.training.setup import build
from gshard_mt.training.step import TrainState

TOKEN_ROUTERS = {"gshard", "switch", "topk", "dropless"}  # top-k of the token's own softmax: prunable by usage


def language_vectors(params: dict, model_cfg, tags: list[int]) -> np.ndarray:
  """[languages, M]: what the language router reads for each tag id, as `Transformer` computes it (the source
  embedding of the tag times the input multiplier of the embedding scheme)."""
  scale = model_cfg.model.emb_dim ** EMBEDDING_SCHEMES[model_cfg.model.embedding][1]
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


def moe_layers(params: dict) -> list[tuple]:
  """The paths of the MoE layers' parameters (each holding wg, wi, wo)."""
  return sorted({path[:-1] for path in traverse_util.flatten_dict(params) if path[-2:] == ("moe", "wg")})


def language_kept(params: dict, model_cfg, tags: list[int]) -> tuple[int, list[np.ndarray]]:
  """`kept_experts` of the experts that the languages whose tag ids are `tags` choose (moe.router='language')."""
  flat = traverse_util.flatten_dict(params)
  vectors = language_vectors(params, model_cfg, tags)
  return kept_experts([chosen_experts({k[-1]: np.asarray(v) for k, v in flat.items() if k[:-1] == layer}, vectors,
                                      model_cfg.moe) for layer in moe_layers(params)])


def layer_names(path: tuple, units: int) -> list[str]:
  """expert_usage's names ('encoder_0', ...) of the MoE layers at a parameter path: a scanned stack's `units`, or
  one looped unit's."""
  side, unit = path[0], path[1]
  return [f"{side}_{u}" for u in range(units)] if unit == "units" else [f"{side}_{unit.split('_')[1]}"]


def usage_kept(params: dict, counts: dict[str, np.ndarray], share: float, k: int) -> tuple[int, list[np.ndarray]]:
  """(E', int [..., E'] per MoE layer): the most used experts of each layer by `counts` {layer name: asked [E]},
  as many as the most any layer needs to carry `share` of its assignments (at least k), in ascending order."""
  flat = traverse_util.flatten_dict(params)
  names = [layer_names(path, flat[path + ("wg",)].shape[0] if path[1] == "units" else 1) for path in moe_layers(params)]
  count = max(k, *(int(usage.experts_for_share(counts[n], share)) for layer in names for n in layer))
  kept = [np.stack([np.sort(np.argsort(-counts[n], kind="stable")[:count]) for n in layer]) for layer in names]
  return count, [keep if path[1] == "units" else keep[0] for keep, path in zip(kept, moe_layers(params))]


def extract_params(params: dict, kept: list[np.ndarray]) -> tuple[dict, dict]:
  """(params with each MoE layer (`moe_layers`) cut to its kept experts int [..., E'], {layer path: kept})."""
  flat = traverse_util.flatten_dict(params)
  layers = moe_layers(params)
  for layer, keep in zip(layers, kept):
    lead = keep.ndim - 1  # the scanned units' axis, or none
    for name, axis in (("wg", lead + 1), (balance.NAME, lead), *((name, lead) for name in ffn.PARAMS)):
      if layer + (name,) in flat:
        value = np.asarray(flat[layer + (name,)])
        index = np.expand_dims(keep, tuple(range(lead + 1, value.ndim)) if axis == lead else lead)
        flat[layer + (name,)] = np.take_along_axis(value, index, axis=axis)
  return traverse_util.unflatten_dict(flat), {"/".join(layer): k.tolist() for layer, k in zip(layers, kept)}


def check_routers(config, workdir, keep: float | None) -> bool:
  """Whether the run is pruned by usage (token-level routers, --keep) rather than cut exactly (language routing);
  a WorkdirError where neither applies."""
  routers_used = {config.moe.router, config.moe.decoder_router or config.moe.router}
  if not config.model.moe_interval:
    raise WorkdirError(f"{workdir}: a dense model (model.moe_interval=0) has no experts to extract")
  if routers_used == {"language"}:
    if keep is not None:
      raise WorkdirError(f"{workdir}: routed by language, whose experts are fixed: leave out --keep")
    if config.moe.balance == "bias":
      raise WorkdirError(f"{workdir}: trained with moe.balance='bias', whose experts are the top-k of softmax "
                         "+ bias: a model of fewer experts may choose others, so extraction would not be exact")
    return False
  if not routers_used <= TOKEN_ROUTERS:
    raise WorkdirError(f"{workdir}: extraction needs moe.router='language' in the encoder and the decoder, or "
                       f"token-level routers {sorted(TOKEN_ROUTERS)} with --keep; this one has {sorted(routers_used)}")
  if keep is None or not 0 < keep <= 1:
    raise WorkdirError(f"{workdir}: routed by token ({sorted(routers_used)}): pass --keep, the share of the "
                       f"languages' assignments the kept experts carry, in (0, 1] (got {keep})")
  return True


def usage_counts(workdir, split: str, step: int, languages: list[str]) -> dict[str, np.ndarray]:
  """{layer name: the languages' assignments asked for [E], summed} from expert_usage.json of (split, step),
  measured first where it is missing."""
  path = expert_usage.output_dir(workdir, split, step) / "expert_usage.json"
  result = json.loads(path.read_text()) if path.exists() else expert_usage.measure(workdir, split, step)
  missing = [lang for lang in languages if lang not in result["languages"]]
  if missing:
    raise WorkdirError(f"{path}: no {split} pairs of {missing} (languages: {', '.join(result['languages'])})")
  return {layer: sum(np.asarray(c[lang][0], np.int64) for lang in languages) for layer, c in result["counts"].items()}


def selection(run, languages: list[str], args, by_usage: bool) -> tuple[int, list[np.ndarray], dict]:
  """(E', the kept experts per MoE layer, what extracted.json adds) of the restored `run` for `languages`."""
  params = jax.device_get(run.params)
  if not by_usage:
    tags = [run.data.tokenizer.tag_id(lang) for lang in languages]
    if None in tags:
      unknown = [lang for lang, tag in zip(languages, tags) if tag is None]
      raise WorkdirError(f"{args.workdir}: no source-language tag for {unknown} in its vocabulary")
    return *language_kept(params, run.model_cfg, tags), {}
  counts = usage_counts(args.workdir, args.usage_split, run.step, languages)
  moe = run.model_cfg.moe
  count, kept = usage_kept(params, counts, args.keep, max(routers.experts_per_token(moe, d) for d in (False, True)))
  flat_kept = {n: k for path, keep in zip(moe_layers(params), kept)
               for n, k in zip(layer_names(path, len(np.atleast_2d(keep))), np.atleast_2d(keep))}
  carried = {n: round(float(counts[n][k].sum() / max(counts[n].sum(), 1)), 4) for n, k in flat_kept.items()}
  return count, kept, {"keep": args.keep, "usage_split": args.usage_split, "carried": carried}


def main(argv):
  parser = cli.parser(__doc__)
  parser.add_argument("--workdir", required=True, help="a MoE run (language routing, or token-level with --keep)")
  parser.add_argument("--languages", required=True, help="comma-separated source languages to keep, e.g. fra,deu")
  parser.add_argument("--step", type=int, default=None, help="the checkpoint (default: the newest)")
  parser.add_argument("--keep", type=float, default=None, help="token-level routers: the share of the languages' "
                      "assignments the kept experts carry in each layer, e.g. 0.9")
  parser.add_argument("--usage_split", default="dev", choices=expert_usage.SPLITS, help="where --keep counts them")
  parser.add_argument("--output", default=None, help="default: <workdir>-<languages joined by '-'>[-<keep>]")
  args = parser.parse_args(argv)
  languages = [lang.strip() for lang in args.languages.split(",") if lang.strip()]
  suffix = "" if args.keep is None else f"-{args.keep:g}"
  output = io.path(args.output or f"{str(args.workdir).rstrip('/')}-{'-'.join(languages)}{suffix}")
  config = validate.load_saved(args.workdir)
  io.check_writable(output, "output work directory", create=False)  # before the checkpoint and data are read
  if (output / checkpoint_lib.FOLDER).is_dir() and any((output / checkpoint_lib.FOLDER).iterdir()):
    raise WorkdirError(f"{output}: holds checkpoints already (an earlier extraction?); remove it or pass --output")
  by_usage = check_routers(config, args.workdir, args.keep)
  run = evaluate.restore(args.workdir, step=args.step)
  count, kept, extra = selection(run, languages, args, by_usage)
  params, kept = extract_params(jax.device_get(run.params), kept)
  prepared = str(prepare_lib.root(config.data, args.workdir))  # the same corpus and tokenizer
  config = config_lib.replace(config, {"moe.num_experts": count, "data.prepared_dir": prepared if "://" in prepared
                                       else os.path.abspath(prepared)})
  config_files.save(config, output)
  setup = build(config, run.data.tokenizer)
  params = jax.device_put(params, setup.state_shardings.params)
  state = TrainState(step=jnp.asarray(run.step, jnp.int32), params=params, opt_state=jax.jit(setup.tx.init)(params),
                     rng=jax.random.key_data(jax.random.key(config.seed)))
  with checkpoint_lib.Checkpoints(output / checkpoint_lib.FOLDER, async_save=False) as ckpts:
    ckpts.save(run.step, state, {"seed": config.data.seed, "next_index": 0}, force=True)
  io.write_atomically(output / "extracted.json", json.dumps(
      {"from": str(args.workdir), "step": run.step, "languages": languages, "num_experts": count, "kept": kept}
      | extra, indent=2))
  print(f"wrote {output}: {count} of {run.model_cfg.moe.num_experts} experts per MoE layer for {', '.join(languages)}")


if __name__ == "__main__":
  cli.run(main)
