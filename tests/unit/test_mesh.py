"""The device mesh from the config: in-slice (ICI) and across-slice (DCN) sizes, mesh.data = -1, and the errors
that name the keys; building the mesh."""

import types

import jax
import pytest

from gshard_mt import cli
from gshard_mt.config.layout import MeshConfig
from gshard_mt.errors import ConfigError
from gshard_mt.parallel import mesh as mesh_lib
from tests.helpers import ROOT

TINY = ROOT / "configs" / "tiny.py"


def test_mesh_must_match_devices():
  c = cli.load(TINY, {"mesh.data": "2", "mesh.expert": "2", "moe.group_size": "32"})
  with pytest.raises(ConfigError, match="= 4 does not match the 8 devices"):
    mesh_lib.check(c, 8)
  mesh_lib.check(c, 4)
  assert mesh_lib.mesh_shape(cli.load(TINY, {"mesh.data": "-1", "mesh.expert": "2"}), 8) == (4, 2, 1)
  with pytest.raises(ConfigError, match="mesh.expert=3 x mesh.model=1 does not divide the 8 devices"):
    mesh_lib.mesh_shape(cli.load(TINY, {"mesh.expert": "3", "moe.num_experts": "3"}), 8)


def test_dcn_mesh_multiplies_the_slice_mesh():
  c = cli.load(TINY, {"dcn_mesh.data": "2", "mesh.expert": "2"})
  assert mesh_lib.ici_shape(c, 8) == (2, 2, 1)
  assert mesh_lib.mesh_shape(c, 8) == (4, 2, 1)
  with pytest.raises(ConfigError, match="dcn_mesh asks for 3 slices, which does not divide the 8"):
    mesh_lib.mesh_shape(cli.load(TINY, {"dcn_mesh.data": "3"}), 8)
  with pytest.raises(ConfigError, match="does not match the 2 devices of each of the 2 slices"):
    mesh_lib.mesh_shape(cli.load(TINY, {"dcn_mesh.data": "2", "mesh.data": "4"}), 4)
  with pytest.raises(ConfigError, match="not divisible by the expert axis, mesh.expert=2 x dcn_mesh"):
    cli.load(TINY, {"dcn_mesh.expert": "3", "mesh.expert": "2", "moe.num_experts": "8"})
  # One process is one slice: asking for two is an error naming both counts.
  devices = [types.SimpleNamespace(process_index=0)] * 2
  with pytest.raises(ConfigError, match=r"asks for 2 slices, but the devices \(2\) are on 1 process \("):
    mesh_lib.make_mesh(cli.load(TINY, {"dcn_mesh.data": "2"}), devices=devices)


def test_make_mesh_names_the_axes_in_order():
  mesh = mesh_lib.make_mesh(cli.load(TINY), devices=jax.devices()[:1])
  assert mesh.axis_names == mesh_lib.MESH_AXES == ("data", "expert", "model")
  assert dict(mesh.shape) == {"data": 1, "expert": 1, "model": 1}


def test_dcn_shape_reads_the_three_axes_in_mesh_order():
  assert mesh_lib.dcn_shape(types.SimpleNamespace(dcn_mesh=MeshConfig(model=3, data=2, expert=1))) == (2, 1, 3)
  # The sizes are checked once, by the config.
  with pytest.raises(ConfigError, match="dcn_mesh sizes must be positive integers"):
    cli.load(TINY, {"dcn_mesh.data": "0"})
  with pytest.raises(ConfigError, match=r"mesh sizes must be positive \(mesh.data may be -1\), got data=-1 expert=0"):
    cli.load(TINY, {"mesh.expert": "0"})
