"""What training, evaluation and the dry run build from a config: the train state, the optimizer, the mesh and
the state's shardings, all without allocating anything until asked."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from gshard_mt.data.tokenizer import Tokenizer
from gshard_mt.kernels import seam
from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch
from gshard_mt.parallel import mesh as mesh_lib
from gshard_mt.parallel import rules as rules_lib
from gshard_mt.parallel import shardings
from gshard_mt.training import checkpoint as checkpoint_lib
from gshard_mt.training.optimizer import make_optimizer
from gshard_mt.training.step import TrainState, train_step


@dataclasses.dataclass
class Setup:
  """What training and evaluation build from a config: model, optimizer, mesh, shardings, abstract state."""

  model_cfg: TransformerConfig
  mesh: jax.sharding.Mesh
  rules: list
  tx: optax.GradientTransformation
  abstract_state: TrainState
  state_shardings: TrainState

  def init_state(self, seed: int) -> TrainState:
    init = functools.partial(_init_state, Transformer(self.model_cfg), self.tx, seed)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return jax.jit(init, out_shardings=self.state_shardings)()

  def jit_train_step(self, model: Transformer, config):
    """The jitted train step with the state's and the batch's shardings fixed (the state is donated)."""
    return jax.jit(functools.partial(train_step, model=model, tx=self.tx, config=config),
                   in_shardings=(self.state_shardings, shardings.batch_sharding(self.mesh, self.rules)),
                   out_shardings=(self.state_shardings, None), donate_argnums=0)

  def abstract_target(self):
    """The abstract state with its shardings: what a checkpoint restores into."""
    return checkpoint_lib.abstract_with_shardings(self.abstract_state, self.state_shardings)


def state_rng(seed: int) -> jax.Array:
  """The train state's rng (raw key data) of a run with `seed`, however its parameters were made."""
  return jax.random.key_data(jax.random.fold_in(jax.random.key(seed), 1))


def _init_state(model: Transformer, tx, seed, boxed=False):
  """The initial state; boxed=True keeps the parameters' logical axes (and leaves out the optimizer state)."""
  variables = model.init({"params": jax.random.key(seed)}, dummy_batch(1, 8))
  params = variables["params"] if boxed else nn.unbox(variables["params"])
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=None if boxed else tx.init(params),
                    rng=state_rng(seed))


def build(config, vocab: int | Tokenizer, devices=None) -> Setup:
  """Model, optimizer, mesh and the shardings of the train state, all without allocating anything; the model's
  `auto` options are resolved for the mesh's platform (and logged). vocab: the run's tokenizer (its vocabulary size
  and start id), or a vocabulary size alone (start id 0: shapes, benchmarks)."""
  mesh = mesh_lib.make_mesh(config, devices)
  device = mesh.devices.flat[0]
  vocab_size, start = (vocab, 0) if isinstance(vocab, int) else (vocab.vocab_size, vocab.ids.start)
  model_cfg = TransformerConfig.from_config(config, vocab_size, device.platform)
  model_cfg = dataclasses.replace(model_cfg, start_id=start, ops=seam.pick(config, model_cfg, device))
  rules = rules_lib.rules(config)
  # The model is traced once here (its trace is a good part of a warm start): the optimizer's state from the
  # parameters' shapes alone.
  abstract = jax.eval_shape(functools.partial(_init_state, Transformer(model_cfg), None, 0, True))
  boxed = abstract.params
  param_shardings = shardings.param_shardings(boxed, mesh, rules)
  tx = make_optimizer(config.optimizer, jax.tree.map(lambda s: s.spec, param_shardings),
                      total_steps=config.num_train_steps, adafactor_update=model_cfg.ops.adafactor_update)
  params = nn.unbox(boxed)
  abstract = abstract.replace(params=params, opt_state=jax.eval_shape(tx.init, params))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state_shardings = TrainState(
      step=replicated, params=param_shardings, rng=replicated,
      opt_state=shardings.optimizer_shardings(tx, abstract.opt_state, boxed, mesh, rules))
  return Setup(model_cfg, mesh, rules, tx, abstract, state_shardings)
