"""The MoE-versus-dense study (configs/study.py): dense and 4, 8, 16, 32 experts on the joined corpus, then
bilingual dense baselines for three Multi30k languages and three low-resource Tatoeba languages.

  make study       # trains, decodes each point's lowest-dev-loss checkpoint, writes runs/sweeps/study/report.md

The dense point replaces each MoE layer's top-2 of experts of hidden H=256 by a dense FFN: with an FFN of 256 in
the other layers, a dense hidden of 384 everywhere gives the same FLOPs per token. Bilingual baselines use that
dense model on one language's data, Multi30k ones for 600 steps; the low-resource ones have a vocabulary and a run
(200 steps) sized to their few hundred pairs (they overfit early, and the study decodes each point's best
checkpoint). configs/sweeps/study_long.py trains the same points ten times longer.

Result (44 min on 2 cores; docs/performance.md): best dev loss 3.785 dense, 3.763-3.791 with 4-32 experts.
"""

BASE = "configs/study.py"
DENSE = {"model.moe_interval": 0, "model.mlp_dim": 384}
LOW_RESOURCE = ("fry", "bos", "hsb")  # 139, 284, 387 training pairs; Frisian, Bosnian, Upper Sorbian


def get_sweep():
  multilingual = [{"name": "dense", **DENSE}] + [{"name": f"e{e}", "moe.num_experts": e} for e in (4, 8, 16, 32)]
  multi30k = [{"name": f"bi_{lang}", **DENSE, "data.source": "multi30k", "data.languages": lang,
               "data.temperature": 1.0, "num_train_steps": 600} for lang in ("deu", "fra", "ces")]
  low = [{"name": f"bi_{lang}", **DENSE, "data.source": "tatoeba", "data.languages": lang, "data.vocab_size": 1000,
          "num_train_steps": 200, "eval_every": 25, "checkpoint_every": 25, "keep_checkpoints": 8}
         for lang in LOW_RESOURCE]
  return multilingual + multi30k + low
