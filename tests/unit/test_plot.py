"""Pictures of a run: written from metrics.jsonl and expert_load.jsonl, atomically, one routing row per layer."""

import json

import pytest

from gshard_mt.errors import WorkdirError
from gshard_mt.tools import plot


def fake_run(tmp_path, layers=("moe/encoder_0", "moe/decoder_0"), E=4):
  rows, loads = [], []
  for step in (10, 20, 30):
    row = {"step": step, "loss": 5.0 - step / 10, "aux_loss": 2.1, "learning_rate": 1e-3 * step / 30}
    for layer in layers:
      row |= {f"{layer}/top1_dropped": 0.01, f"{layer}/top2_dropped": 0.1, f"{layer}/load_cv": 0.2}
    rows.append(row)
    loads.append({"step": step} | {f"{layer}/load": [1 / E] * E for layer in layers})
  rows.append({"step": 30, "dev_loss": 4.0, "dev_bleu": 1.5, "dev_chrf": 9.0, "dev_bleu_sentences": 64})
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "expert_load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in loads))
  return tmp_path


def test_writes_both_pictures(tmp_path):
  written = plot.plot_run(fake_run(tmp_path))
  assert [p.name for p in written] == ["training.png", "routing.png"]
  assert all(p.stat().length > 10_000 for p in written) and not list(tmp_path.glob(".*tmp*"))


def test_a_dense_run_has_no_routing_picture(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0, "learning_rate": 1e-3}) + "\n")
  assert [p.name for p in plot.plot_run(tmp_path)] == ["training.png"]


def test_not_a_run_is_a_clear_error(tmp_path):
  with pytest.raises(WorkdirError, match="metrics.jsonl not found or empty"):
    plot.plot_run(tmp_path)


def fake_sweep(tmp_path, rows):
  from gshard_mt.tools import sweep

  sweep.write_tables(rows, tmp_path)
  return tmp_path


EXPERTS = [{"name": "dense", "model.moe_interval": 0, "model.mlp_dim": 384, "parameters": 1.1e6, "step": 600,
            "dev_loss": 3.4, "tokens_per_s": 9000.0, "bleu": 2.5}] + [
    {"name": f"e{e}", "moe.num_experts": e, "parameters": 1e6 * e, "step": 600, "dev_loss": 3.3 - e / 100,
     "tokens_per_s": 8000.0, "bleu": 3.0 + e / 10} for e in (4, 8, 16, 32)]


def test_swept_key_is_the_config_value_most_points_set():
  assert plot.swept_key(EXPERTS) == "moe.num_experts"  # dense sets two other keys, once
  both = [{"name": n, "model.embedding": e, "model.tied_logits": t, "dev_loss": 1.0}
          for n, e, t in (("a", "t5", True), ("b", "vaswani", False))]
  assert plot.swept_key(both) is None  # two factors: the points are categories
  common = [{"name": f"cf{c}", "num_train_steps": 250, "moe.train_capacity_factor": c} for c in (1.0, 2.0)]
  assert plot.swept_key(common) == "moe.train_capacity_factor"  # a key shared by every point is not swept


def test_sweep_picture_from_results_csv(tmp_path):
  root = fake_sweep(tmp_path, EXPERTS)
  rows = plot.read_results(root / "results.csv")
  assert rows[0]["moe.num_experts"] is None and rows[1]["moe.num_experts"] == 4.0 and rows[0]["name"] == "dense"
  assert [p.name for p in plot.plot_run(root)] == ["results.png"]  # a sweep's root: redrawn from its table
  assert (root / "results.png").stat().st_size > 10_000 and not list(root.glob(".*tmp*"))


@pytest.mark.parametrize("rows", [
    [{"name": n, "model.embedding": e, "model.tied_logits": t, "dev_loss": 3.0 + i / 10, "bleu": None}
     for i, (n, e, t) in enumerate((("sqrt_tied", "sqrt_input", True), ("vaswani_untied", "vaswani", False)))],
    [{"name": f"policy_{p}", "moe.second_expert_policy": p, "dev_loss": 3.0} for p in ("all", "random")],
    [{"name": "only", "moe.num_experts": 4, "dev_loss": None}]])
def test_sweep_picture_of_categories_and_unfinished_points(tmp_path, rows):
  assert plot.plot_run(fake_sweep(tmp_path, rows))[0].stat().length > 10_000


def test_the_greedy_sample_is_named_with_its_size():
  """Runs log the per-language sample (dev_bleu_greedy); runs logged before it, a sample spread over the languages."""
  rows = [{"step": 10, "dev_bleu_greedy": 1.0, "dev_chrf_greedy": 9.0, "dev_bleu_per_language": 32,
           "dev_bleu_languages": 112, "dev_bleu_sentences": 3351}]
  assert plot.greedy_sample(rows) == ("dev_bleu_greedy", "dev_chrf_greedy", "32 sentences x 112 languages")
  old = [{"step": 10, "dev_bleu": 8.4, "dev_chrf": 9.8, "dev_bleu_sentences": 112}]
  assert plot.greedy_sample(old) == ("dev_bleu", "dev_chrf", "112-sentence sample")


def heatmaps(fig) -> list:
  """The load heatmaps of a routing figure (the colour bar draws its own mesh)."""
  return [mesh for ax in fig.axes if ax.get_title().endswith("expert load") for mesh in ax.collections]


def column_edges(mesh) -> list[float]:
  return mesh.get_coordinates()[0, :, 0].tolist()


def test_every_layer_shares_one_colour_scale_for_the_load():
  """Layers whose loads span different ranges (0-1.2 and 0-3 times balanced) draw them on one scale: one colour
  bar, and the same colour for 'balanced' (load x E = 1) and for any other load in every layer."""
  layers = ("moe/encoder_0", "moe/decoder_0")
  loads = [{"step": step, f"{layers[0]}/load": [0.3, 0.25, 0.25, 0.2],
            f"{layers[1]}/load": [0.75, 0.05, 0.1, 0.1]} for step in (10, 20, 30)]
  rows = [{"step": r["step"]} | {f"{layer}/{k}": 0.1 for layer in layers for k in ("top1_dropped", "top2_dropped")}
          for r in loads]
  fig = plot.routing_figure(rows, loads)
  images = heatmaps(fig)
  assert len(images) == 2 and len(fig.axes) == 2 * 2 + 1  # two rows of (heatmap, drops), one colour bar
  colour = {value: {tuple(image.cmap(image.norm(value))) for image in images} for value in (0.0, 1.0, 1.2, 3.0)}
  assert all(len(colours) == 1 for colours in colour.values()), colour
  assert images[0].norm.vmin == 0 and images[0].norm.vmax == 3.0 and images[0].norm(1.0) == 0.5


def test_a_run_of_one_logged_step_shows_its_points(recwarn):
  """One logged step: the loss, the drops and the load heatmap still show it (a line of one point draws nothing,
  and an image from step 1 to step 1 has no width)."""
  layer = "moe/encoder_0"
  rows = [{"step": 1, "loss": 8.9, f"{layer}/top1_dropped": 0.2, f"{layer}/top2_dropped": 0.4}]
  fig = plot.routing_figure(rows, [{"step": 1, f"{layer}/load": [0.5, 0.3, 0.1, 0.1]}])
  assert column_edges(heatmaps(fig)[0]) == [0.5, 1.5]
  assert [line.get_marker() for line in fig.axes[1].get_lines()] == ["o", "o"]
  assert not [w for w in recwarn if "singular" in str(w.message)]


def test_heatmap_columns_stand_at_their_steps_when_logged_unevenly():
  """A preemption's save or a changed log_every logs steps at uneven intervals: each column spans halfway to its
  neighbours, so it is drawn at its own step (evenly spread columns put step 1000's at 1000 and step 100's at 240)."""
  layer = "moe/encoder_0"
  steps = [50, 100, 137, 150, 200, 1000]
  rows = [{"step": s, f"{layer}/top1_dropped": 0.0, f"{layer}/top2_dropped": 0.0} for s in steps]
  fig = plot.routing_figure(rows, [{"step": s, f"{layer}/load": [0.5, 0.5]} for s in steps])
  edges = column_edges(heatmaps(fig)[0])
  assert edges == [25.0, 75.0, 118.5, 143.5, 175.0, 600.0, 1400.0]
  assert all(a < s < b for a, s, b in zip(edges, steps, edges[1:]))
