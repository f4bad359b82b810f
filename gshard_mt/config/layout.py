"""Where a run runs: the devices of a slice per mesh axis (`mesh`), the slices per axis (`dcn_mesh`), and the
processes (`distributed`). Plain Python, no JAX; gshard_mt.parallel acts on them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gshard_mt.config.checks import Section
from gshard_mt.config.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
  """Devices per mesh axis in one slice."""

  KEY: ClassVar[str] = "mesh"

  data: int = -1  # -1 = all devices not used by the other axes
  expert: int = 1
  model: int = 1

  def check_values(self):
    if self.expert < 1 or self.model < 1 or (self.data < 1 and self.data != -1):
      raise ConfigError(f"mesh sizes must be positive (mesh.data may be -1), got data={self.data} "
                        f"expert={self.expert} model={self.model}")


@dataclasses.dataclass(frozen=True)
class DcnMeshConfig(MeshConfig):
  """Slices per mesh axis: TPU slices joined by the data-centre network, or GPU hosts (each axis is then
  mesh x dcn_mesh)."""

  KEY: ClassVar[str] = "dcn_mesh"

  data: int = 1

  def check_values(self):
    if min(self.data, self.expert, self.model) < 1:
      raise ConfigError(f"dcn_mesh sizes must be positive integers, got {dataclasses.asdict(self)}")


@dataclasses.dataclass(frozen=True)
class DistributedConfig(Section):
  """Multi-process runs: every process runs the same command with its own process_id (or, with auto=True, JAX
  reads them from the cluster: TPU pods, SLURM, ...). One process on one host needs none of this."""

  KEY: ClassVar[str] = "distributed"
  POSITIVE: ClassVar[tuple[str, ...]] = ("num_processes",)
  NONNEGATIVE: ClassVar[dict[str, str]] = {"process_id": "0 = the coordinator"}

  auto: bool = False  # jax.distributed.initialize() with the cluster's own settings
  coordinator_address: str = ""  # host:port of process 0
  num_processes: int = 1
  process_id: int = 0

  def check_values(self):  # settings that would be ignored: each host would then train alone
    super().check_values()
    settings = {"coordinator_address": self.coordinator_address, "num_processes": self.num_processes != 1,
                "process_id": self.process_id}
    given = [f"distributed.{k}" for k, v in settings.items() if v]
    if self.auto and given:
      raise ConfigError(f"distributed.auto=True reads the process layout from the cluster: leave {', '.join(given)} "
                        "unset")
    if not self.auto and given and self.num_processes == 1:
      raise ConfigError(f"{', '.join(given)} given for one process: set distributed.num_processes")
    if self.process_id >= self.num_processes:
      raise ConfigError(f"distributed.process_id={self.process_id}: expected 0 to num_processes - 1 = "
                        f"{self.num_processes - 1}")
