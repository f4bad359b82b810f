"""The tables of an accelerator-suite run (bench/gpu_suite.py) as markdown, printed by the suite: its JSON's figures."""

from __future__ import annotations


def loss_cell(row: dict, digits: int) -> str:
  """A training row's loss at its first and last timed step, and the updates skipped as not finite (rows written
  before the suite recorded them: empty)."""
  losses = " -> ".join(f"{loss:.{digits}f}" for loss in row.get("losses", ()))
  return losses + (f" ({row['skipped_steps']} updates skipped: not finite)" if row.get("skipped_steps") else "")


def markdown(result: dict) -> str:
  """The tables of a suite run, as markdown."""
  env = result["environment"]
  lines = [f"## Accelerator suite: {env['device']} ({env['date']})", "",
           f"{env['device_count']} x {env['device']} ({env['platform']}), JAX {env['jax']}, flax {env['flax']}, "
           f"commit {env['commit']}, " + (f"XLA_FLAGS `{env['xla_flags']}`. " if env["xla_flags"] else "no XLA_FLAGS. ")
           + f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} minutes"
           + ("" if result.get("finished", True) else ", stopped before the end: the sections below ran") + "); "
           f"JSON: `{result['json']}`.", ""]
  moe = result.get("moe_layer")  # None: not run (--sections), as any section below may not be
  if moe is not None and "error" in moe:
    lines += [f"MoE layer: failed ({moe['error']})", ""]
  elif moe is not None:
    s = moe["shape"]
    lines += [f"MoE layer, forward + backward: {s['tokens']:,} tokens, M={s['model_dim']}, H={s['hidden_dim']}, "
              f"E={s['experts']}, S={s['group_size']}, capacity factor {s['capacity_factor']}, {s['dtype']}, "
              f"median of {s['repeats']}. The grouped FFN alone: its six grouped matmuls on about 2 x tokens rows in "
              "E uneven blocks (one empty), checked against ragged_dot (largest difference relative to the largest "
              "value).", "",
              "| variant | ms | useful TFLOP/s | ratio to dense 2H | max rel. diff to ragged_dot |",
              "|---|---|---|---|---|"]
    for r in moe["rows"]:
      diff = f"{r['max_rel_diff_to_ragged_dot']:.1e}" if "max_rel_diff_to_ragged_dot" in r else ""
      lines.append(f"| {r['variant']} | failed: {r['error']} | | | |" if "error" in r else
                   f"| {r['variant']} | {r['ms']:.2f} | {r['useful_tflops']:.1f} | {r['ratio_to_dense']:.2f} "
                   f"| {diff} |")
    lines.append("")
  lines += ["Training step (packed Tatoeba-112 batches; tokens are real source + target tokens; the variants of "
            "`VARIANTS`, each step against its config's defaults):", "",
            "| config | variant | rows x source / target tokens | step ms | vs defaults | tokens/s | MFU | loss, first "
            "and last timed step |",
            "|---|---|---|---|---|---|---|---|"] if "training" in result else []
  defaults = {r["config"]: r.get("step_ms") for r in result.get("training", []) if r["variant"] == "defaults"}
  for r in result.get("training", []):
    if "error" in r:
      lines.append(f"| {r['config']} | {r['variant']} | failed: {r['error']} | | | | | |")
    else:
      mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
      versus = f"{r['step_ms'] / defaults[r['config']]:.2f}x" if defaults.get(r["config"]) else "n/a"
      lines.append(f"| {r['config']} | {r['variant']} | {r['batch_size']} x {' / '.join(map(str, r['row_lengths']))} "
                   f"| {r['step_ms']:.1f} | {versus} | {r['tokens_per_s']:,.0f} | {mfu} | {loss_cell(r, 3)} |")
  profiles = {r["config"]: r for r in result.get("profile", []) if "error" not in r}
  if "profile" in result:
    lines += ["", "Profile of the training step, traced (device time per step by part of the model):", ""]
  if profiles:
    import profile_step  # bench/profile_step.py

    lines += [profile_step.describe(label, p) + "." for label, p in profiles.items()]
    lines += ["", profile_step.table(profiles).rstrip()]
    for label, p in profiles.items():
      lines += ["", f"The longest instructions of {label}:", "", profile_step.top_table(p).rstrip()]
  lines += [f"{r['config']}: failed ({r['error']})." for r in result.get("profile", []) if "error" in r]
  d = result.get("decoding")
  lines += [] if d is None else ["", "Decoding, test split (" + (f"failed: {d['error']})" if "error" in d else
            f"{d['config']}, {d['params']}, beam {d['beam']}, {d['batch_size']} sentences per batch, "
            f"max length {d['max_length']}): {d['sentences']:,} sentences in {d['seconds']:.1f} s, "
            f"{d['sentences_per_s']:,.1f} sentences/s, {d['tokens_per_s']:,.0f} tokens/s."), ""]
  return "\n".join(lines) + "\n"
