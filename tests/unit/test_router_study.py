"""The router study's report: points from runs by seed, the seed spread, and the verdict against it."""

from gshard_mt.tools import router_study


def run(name, bleu, dev_loss):
  layer = {"load_cv": 0.1, "load_min": 0.2, "load_max": 0.3, "top1_dropped": 0.01, "top2_dropped": 0.02}
  return {"name": name, "experts": 4, "dev_loss": dev_loss, "average_bleu": bleu, "tokens_per_s": 1000.0,
          "bleu": {"deu": bleu - 1, "fra": bleu + 1}, "routing": {"encoder_0": layer}, "curve": [(100, 3.0)]}


def test_points_spreads_and_verdict():
  runs = [run("dense_s0", 30.0, 2.0), run("dense_s1", 31.0, 2.1), run("gshard_s0", 30.5, 1.95),
          run("gshard_s1", 30.7, 1.97), run("switch_s0", 33.0, 1.9), run("switch_s1", 32.0, 1.92)]
  points = router_study.aggregate(runs)
  assert [p["point"] for p in points] == ["dense", "gshard", "switch"]
  assert points[0]["bleu"] == {"mean": 30.5, "spread": 1.0, "seeds": [30.0, 31.0]}
  assert points[2]["bleu_by_language"]["fra"]["mean"] == 33.5
  v = router_study.verdict(points)
  assert v["bleu"]["best"] == "switch" and v["dev_loss"]["best"] == "switch"
  against = v["bleu"]["against"]
  dense = against["dense twin"]
  assert dense["lead"] == 2.0 and dense["noise"] == 1.0 and dense["beyond_noise"]
  assert against["runner-up, today's default"]["point"] == "gshard"  # dense is 30.5, gshard 30.6
  close = v["dev_loss"]["against"]["runner-up, today's default"]
  assert abs(close["lead"] - 0.05) < 1e-9 and close["beyond_noise"]
  text = router_study.markdown(points, v)
  assert ("**average test BLEU**: switch is best, ahead of gshard (runner-up, today's default) by +1.9 BLEU "
          "(beyond") in text
  assert "| switch | 32.50 ± 0.50 | 33.0 / 32.0 |" in text


def test_points_not_yet_decoded_on_every_seed_have_no_bleu_and_no_verdict_label():
  """A point with one seed decoded would show a spread of 0 and a lead beyond it; dense not decoded at all made the
  verdict fail."""
  runs = [run("dense_s0", 0.0, 2.0), run("dense_s1", 0.0, 2.1), run("gshard_s0", 30.5, 1.95),
          run("gshard_s1", 30.7, 1.97), run("switch_s0", 33.0, 1.9), run("switch_s1", 0.0, 1.92)]
  for r in runs:
    if r["average_bleu"] == 0.0:  # trained, not decoded
      r["average_bleu"] = r["bleu"] = None
  points = router_study.aggregate(runs)
  assert points[0]["bleu"] is None and points[2]["bleu"] is None and points[2]["bleu_by_language"] == {}
  assert points[1]["bleu"]["seeds"] == [30.5, 30.7]
  v = router_study.verdict(points)
  assert "bleu" not in v  # gshard alone is decoded: nothing to rank it against
  assert v["dev_loss"]["best"] == "switch" and "dense twin" in v["dev_loss"]["against"]
  router_study.markdown(points, v)
