"""Planning helpers of the dry run: the --mesh and --remat_policies arguments, fitting the MoE group size to a mesh,
and the step time extended from unrolled compiles."""

import pytest

from gshard_mt import cli
from gshard_mt import config as config_lib
from gshard_mt.errors import ConfigError, UserError
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.tools import dryrun
from gshard_mt.tpu.estimates import step_cost
from tests.helpers import ROOT

TINY = ROOT / "configs" / "tiny.py"  # 8 rows x 128 / 80 tokens = 1024 / 640 tokens, group size 128: 8 / 5 groups


def test_parse_mesh():
  assert dryrun.parse_mesh("data=2,expert=4") == {"data": 2, "expert": 4}
  with pytest.raises(ConfigError, match="expected data=N,expert=N,model=N"):
    dryrun.parse_mesh("experts=4")


def test_parse_remat_policies():
  assert dryrun.parse_remat_policies("none,dots_no_batch") == ["none", "dots_no_batch"]
  with pytest.raises(ConfigError, match=r"--remat_policies 'none,some': unknown \['some'\]; expected some of"):
    dryrun.parse_remat_policies("none,some")


@pytest.mark.parametrize("mesh, devices, expected", [
    ({"mesh.data": "2", "mesh.expert": "4"}, 8, 16),  # 5 target groups cannot split over 8: 64 / 40 groups of 16
    ({"mesh.data": "1", "mesh.expert": "1"}, 1, None),  # the configured size works
    ({"mesh.data": "4", "mesh.expert": "1", "partitioning": "data"}, 4, 32),  # 32 / 20 groups of 32 over data
    ({"mesh.data": "8", "mesh.expert": "1", "partitioning": "data", "data.max_length": "64",
      "data.max_target_length": "0"}, 8, 64),  # equal sides of 512 tokens: 4 groups, then 8 of 64
    ({"mesh.data": "1", "mesh.expert": "2", "partitioning": "data"}, 2, None),  # groups are not split over expert
])
def test_fit_group_size(mesh, devices, expected):
  config = cli.load(TINY, mesh)
  assert dryrun.fit_group_size(config, devices) == expected
  mesh_lib.check(config_lib.replace(config, {"moe.group_size": expected or 128}), devices)  # what then compiles


def test_fit_group_size_fits_the_microbatch():
  """2 microbatches of 4 rows on 4 devices: 512 / 320 tokens, 8 / 5 groups of 64 (5 do not split over 4; 16 / 10
  of 32 neither); 32 / 20 groups of 16 split."""
  config = cli.load(TINY, {"num_microbatches": "2", "moe.group_size": "64"})
  assert dryrun.fit_group_size(config, 4) == 16


def test_load_for_says_which_size_it_chose(capsys):
  config = dryrun.load_for(TINY, {"mesh.data": "2", "mesh.expert": "4"}, 8)
  assert config.moe.group_size == 16
  assert "moe.group_size=128 does not split over this mesh; using moe.group_size=16" in capsys.readouterr().err
  asked = cli.load(TINY, {"mesh.data": "2", "mesh.expert": "4"})
  assert dryrun.fit_to_mesh(asked, 8)[1] == {"moe.group_size": [128, 16]}
  assert dryrun.fit_to_mesh(config_lib.replace(asked, {"moe.group_size": 16}), 8)[1] == {}  # it fits: no change


@pytest.mark.parametrize("units, points", [
    ((1, 1), [(1, 1)]), ((18, 18), [(1, 1), (2, 2)]), ((6, 1), [(1, 1), (2, 1)]), ((3, 4), [(1, 1), (2, 1), (1, 2)]),
])
def test_step_cost_extends_linearly_from_one_and_two_units(units, points):
  """A cost a + b x encoder units + c x decoder units is recovered exactly from the points compiled."""
  assert step_cost.depth_points(units) == points
  cost = lambda ne, nd: 0.5 + 0.25 * ne + 0.125 * nd  # noqa: E731
  assert step_cost.extend_to_depth({p: cost(*p) for p in points}, units) == cost(*units)


class _Program:
  """A compiled CPU program standing in for a TPU one, with a given optimal_seconds."""

  def __init__(self, fn, seconds):
    import jax
    import jax.numpy as jnp

    self.text, self.seconds = jax.jit(fn).lower(jnp.ones(4)).compile().as_text(), seconds

  def as_text(self):
    return self.text

  def cost_analysis(self):
    return {"optimal_seconds": self.seconds, "flops": 8.0}


def test_step_time_of_a_program_without_loops_is_its_own():
  """Unrolled layers: the configured program is the whole step; nothing is extended or compiled."""
  config = cli.load(TINY, {"model.num_encoder_layers": "4", "model.num_decoder_layers": "4"})
  t = step_cost.step_time(config, [], _Program(lambda x: x * 2, 0.25), points={})
  assert t["seconds"] == 0.25 and t["compiles"] == 0 and t["points"]["configured"]["uncounted_loops"] == 0
  assert "the configured program" in step_cost.step_time_note({"depth_points": t["points"], **{
      "step_flops_per_device": 8.0, "time_compiles": 0}})


def test_step_time_of_a_program_with_loops_is_extended():
  """Scanned layers (a loop of 2 units per stack): the loop body is counted once, so the step time comes from the
  1- and 2-unit points (here given, as a sweep shares them), not from the program."""
  import jax

  config = cli.load(TINY, {"model.num_encoder_layers": "4", "model.num_decoder_layers": "4"})
  looped = _Program(lambda x: jax.lax.fori_loop(0, 2, lambda i, y: y * 2, x), 0.25)
  points = {(1, 1): {"seconds": 1.0, "flops": 4.0, "uncounted_loops": 0},
            (2, 2): {"seconds": 1.5, "flops": 6.0, "uncounted_loops": 0}}
  t = step_cost.step_time(config, [], looped, points=points)
  assert t["seconds"] == 1.5 and t["flops"] == 6.0 and t["compiles"] == 0 and list(t["points"]) == ["1+1", "2+2"]
  assert "extended linearly" in step_cost.step_time_note({"depth_points": t["points"], **{
      "step_flops_per_device": 6.0, "time_compiles": 0}})


def test_unit_counts():
  assert step_cost.unit_counts(cli.load(TINY)) == (1, 1)  # 2 + 2 layers, a MoE layer every 2nd
  dense = cli.load(TINY, {"model.moe_interval": "0", "model.num_decoder_layers": "3"})
  assert step_cost.unit_counts(dense) == (2, 3)


def test_no_devices_is_refused_before_anything_is_created(tmp_path):
  with pytest.raises(UserError, match="--devices must be at least 1, got 0"):
    dryrun.main(["--config", str(ROOT / "configs" / "tiny.py"), "--devices", "0", "--out", str(tmp_path / "out")])
  assert not (tmp_path / "out").exists()
