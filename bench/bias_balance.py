"""Bias balancing (moe.balance='bias', DeepSeek-V3 section 2.1.2) under capacity: which load should move the biases.

A tiny MoE Transformer (configs/tiny.py shrunk: M=64, 2 + 2 layers, a `switch` MoE layer in each stack, E=8, S=64,
capacity factor 1.0, so C = S / E and capacity binds) trains on a synthetic copy task whose tokens follow a Zipf
law, under two rules for the selection biases, from the same initialisation and batches:

- 'kept' (the rule before issue 39): b <- b + gamma * sign(mean - load) with load the float32 fractions of the
  assignments capacity *kept*; reproduced here by overwriting the biases after each train step;
- 'requested' (the rule now, `gshard_mt.moe.balance`): the same with the counts of the assignments the router
  *asked for* before capacity, exact in integers.

For each it records, per MoE layer, the spread (max / min over experts) of the asked-for load, summed over the
first 10 steps and over the last 50, and the fraction of assignments capacity dropped.

  python bench/bias_balance.py                       # 300 steps, gamma 0.01, seeds 0-2: about 4 min on 2 CPU cores
  python bench/bias_balance.py --steps 500 --rate 0.001 --seeds 0

Writes bench/results/bias_balance.json (or --out) and prints it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import pathlib
import platform
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from gshard_mt import cli
from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
from gshard_mt.moe import balance
from gshard_mt.training.step import TrainState, train_step

ROOT = pathlib.Path(__file__).resolve().parents[1]
B, L, V, E = 16, 32, 256, 8


def get_config(rate: float):
  overrides = {"model.emb_dim": 64, "model.num_heads": 2, "model.head_dim": 32, "model.mlp_dim": 128,
               "model.num_encoder_layers": 2, "model.num_decoder_layers": 2, "model.dropout_rate": 0.0,
               "moe.num_experts": E, "moe.hidden_dim": 64, "moe.group_size": 64, "moe.router": "switch",
               "moe.train_capacity_factor": 1.0, "moe.min_capacity": 1, "moe.balance": "bias",
               "moe.aux_loss_weight": 0.0, "moe.bias_update_rate": rate, "data.max_length": L,
               "data.max_target_length": 0, "batch_size": B, "optimizer.name": "adam",
               "optimizer.learning_rate": 3e-3, "optimizer.warmup_steps": 20}
  return cli.load(ROOT / "configs" / "tiny.py", {k: str(v) for k, v in overrides.items()})


def batches(steps: int, seed: int):
  """A copy task (target = source) of one sentence per row, tokens drawn from a Zipf law over the vocabulary."""
  rng = np.random.default_rng(seed)
  p = 1.0 / np.arange(1, V) ** 1.1
  for _ in range(steps):
    tokens = rng.choice(np.arange(1, V), size=(B, L), p=p / p.sum())
    yield {key: jnp.asarray(tokens if key in ("inputs", "targets") else np.ones((B, L), np.int32)
                            if key.endswith("segmentation") else np.arange(L)[None].repeat(B, 0))
           for key in dummy_batch(B, L)}


def requested_counts(metrics: dict, tokens: int) -> dict[str, np.ndarray]:
  """{layer: [E] assignments asked for} of one step (switch: one per real token)."""
  return {key[len("moe/"):-len("/requested_load")]: np.rint(np.asarray(v) * tokens)
          for key, v in metrics.items() if key.endswith("/requested_load")}


def kept_rule(params: dict, metrics: dict, rate: float) -> dict:
  """The rule before issue 39: each bias moved by the sign of the kept load's error, in float32 fractions."""
  flat = traverse_util.flatten_dict(params)
  for path, bias in flat.items():
    if path[-1] == balance.NAME:
      load = jnp.stack([metrics[f"moe/{path[0]}_{u}/load"] for u in range(bias.shape[0])])  # [U, E]
      flat[path] = bias + rate * jnp.sign(jnp.mean(load, -1, keepdims=True) - load)
  return traverse_util.unflatten_dict(flat)


def run(rule: str, config, state: TrainState, step, steps: int, seed: int) -> dict:
  """The asked-for load's spread at the start and at the end of `steps` steps of `step` from `state` under
  `rule`."""
  counts, dropped, losses = [], [], []
  for batch in batches(steps, seed):
    old = state.params
    state, metrics = step(state, batch)
    if rule == "kept":
      state = state.replace(params=_with_biases_of(state.params, old, metrics, config.moe.bias_update_rate))
    counts.append(requested_counts(metrics, B * L))
    dropped.append({k[len("moe/"):-len("/top1_dropped")]: float(v) for k, v in metrics.items()
                    if k.endswith("/top1_dropped")})
    losses.append(float(metrics["loss"]))
  return {"rule": rule, "start": _summary(counts[:10], dropped[:10]), "end": _summary(counts[-50:], dropped[-50:]),
          "loss_first": losses[0], "loss_last": float(np.mean(losses[-10:]))}


def compiled(config, seed: int):
  """(the initial state, the jitted train step): the same for both rules, compiled once."""
  model = Transformer(TransformerConfig.from_config(config, V), deterministic=False)
  params = nn.unbox(model.init(jax.random.key(seed), dummy_batch(1, L))["params"])
  tx = optax.adam(config.optimizer.learning_rate)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.key_data(jax.random.key(seed + 1)))
  return state, jax.jit(functools.partial(train_step, model=model, tx=tx, config=config))


def _with_biases_of(params: dict, old: dict, metrics: dict, rate: float) -> dict:
  """`params` with the biases moved from `old`'s by the kept rule (the train step's own move discarded)."""
  moved = kept_rule(old, metrics, rate)
  flat, flat_moved = traverse_util.flatten_dict(params), traverse_util.flatten_dict(moved)
  return traverse_util.unflatten_dict({p: flat_moved[p] if p[-1] == balance.NAME else v for p, v in flat.items()})


def _summary(counts: list[dict], dropped: list[dict]) -> dict:
  """Per layer: the asked-for load summed over the steps, its spread max / min (None where an expert got none)
  and max / mean, and the mean fraction of first choices dropped."""
  out = {}
  for layer in counts[0]:
    total = np.sum([c[layer] for c in counts], axis=0)
    out[layer] = {"requested": total.astype(int).tolist(),
                  "spread": float(total.max() / total.min()) if total.min() > 0 else None,
                  "max_over_mean": float(total.max() / total.mean()),
                  "dropped": float(np.mean([d[layer] for d in dropped]))}
  return out


def _mean_end_spread(runs: list[dict]) -> dict:
  """{rule: {layer: mean over seeds of the end's max / min}} (None where some seed left an expert unasked)."""
  out = {}
  for rule in ("kept", "requested"):
    ends = [r["end"] for r in runs if r["rule"] == rule]
    spreads = {layer: [e[layer]["spread"] for e in ends] for layer in ends[0]}
    out[rule] = {layer: None if None in v else float(np.mean(v)) for layer, v in spreads.items()}
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--rate", type=float, default=0.01)
  parser.add_argument("--seeds", default="0,1,2", help="initialisations and data orders, comma-separated")
  parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bias_balance.json"))
  args = parser.parse_args()
  config = get_config(args.rate)
  started = time.perf_counter()
  runs = []
  for seed in (int(s) for s in args.seeds.split(",")):
    state, step = compiled(config, seed)
    runs += [{"seed": seed} | run(rule, config, state, step, args.steps, seed) for rule in ("kept", "requested")]
  result = {"date": datetime.date.today().isoformat(), "device": jax.devices()[0].device_kind,
            "jax": jax.__version__, "python": platform.python_version(),
            "command": f"python bench/bias_balance.py --steps {args.steps} --rate {args.rate} --seeds {args.seeds}",
            "setup": {"router": "switch", "capacity_factor": 1.0, "E": E, "S": 64, "C": 64 // E, "rows": B,
                      "length": L, "vocab": V, "gamma": args.rate, "steps": args.steps},
            "runs": runs, "mean_end_spread": _mean_end_spread(runs), "seconds": round(time.perf_counter() - started, 1)}
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
  for r in runs:
    for when in ("start", "end"):
      print(r["seed"], r["rule"], when, {layer: (s["spread"], round(s["max_over_mean"], 2), round(s["dropped"], 3))
                              for layer, s in r[when].items()})
  print(f"{result['seconds']} s; wrote {args.out}")


if __name__ == "__main__":
  main()
