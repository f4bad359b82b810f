"""Embedding scale and output tying on Multi30k de->en (configs/multi30k.py, German only, first 250 steps).

  make sweep SWEEP=configs/sweeps/embedding.py    # runs/sweeps/embedding/<name>; results.md beside them

Compares gshard_mt's scheme before 2026-11-23 (std-1 embedding times sqrt(M), tied logits), the same with the
embedding std at M^-0.5, Vaswani et al.'s tied scheme, and the default (Vaswani's input scale, untied logits).
Measured: docs/decisions.md.
"""

BASE = "configs/multi30k.py"
COMMON = {"data.languages": "deu", "num_train_steps": 250, "eval_every": 50, "checkpoint_every": 250}


def get_sweep():
  return [COMMON | {"name": name, "model.embedding": scheme, "model.tied_logits": tied} for name, scheme, tied in (
      ("before_sqrt_input_tied", "sqrt_input", True),
      ("small_logits_tied", "small_logits", True),
      ("vaswani_tied", "vaswani", True),
      ("vaswani_untied", "vaswani", False))]
