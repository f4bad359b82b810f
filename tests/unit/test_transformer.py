"""The Transformer: the initial loss at any width (ln V + 0.5, as the README states), for each embedding scheme
and output tying."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.errors import ConfigError
from gshard_mt.model import decode
from gshard_mt.model.transformer import Transformer, TransformerConfig, dummy_batch

V = 1000


def initial_nll(emb_dim: int, embedding: str, tied_logits: bool = False) -> float:
  """Mean next-token NLL of a freshly initialised model on random tokens."""
  # One layer each side, not scanned and not jitted: the schemes of a width then share every compiled op.
  cfg = TransformerConfig.reference(vocab_size=V, emb_dim=emb_dim, num_heads=2, head_dim=16, mlp_dim=64,
                                    num_encoder_layers=1, num_decoder_layers=1, moe_interval=0, dropout_rate=0.0,
                                    embedding=embedding, tied_logits=tied_logits, scan_layers=False)
  rng = np.random.default_rng(0)
  batch = {k: np.array(v) for k, v in dummy_batch(4, 16).items()}
  batch["inputs"] = rng.integers(3, V, (4, 16)).astype(np.int32)
  batch["targets"] = rng.integers(3, V, (4, 16)).astype(np.int32)
  model = Transformer(cfg)
  params = model.init(jax.random.key(0), batch)
  logits, _ = model.apply(params, batch)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)
  return float(nll.mean())


@pytest.mark.parametrize("embedding", ["vaswani", "t5"])
@pytest.mark.parametrize("emb_dim", [32, 256, 1024])
def test_initial_loss_is_ln_v_plus_half_at_any_width(emb_dim, embedding):
  """The README's claim as stated: unit-variance logits start at ln V + 0.5 (measured +0.37, +0.59, +0.31 above
  ln V at widths 32, 256, 1024: within 0.19 of it). Output weights of 1.6 times the variance (+0.62, +0.92,
  +0.56) fail at width 256, where the old bound, within 1 nat of ln V, passed them all."""
  assert abs(initial_nll(emb_dim, embedding) - (np.log(V) + 0.5)) < 0.25


@pytest.mark.parametrize("embedding", ["sqrt_input", "vaswani"])
def test_tied_logits_start_far_above_uniform_at_large_width(embedding):
  """Through a tied output embedding the decoder's input token, which dominates the residual stream at
  initialisation, gets a logit growing like sqrt(M): why tied_logits is off by default."""
  assert initial_nll(1024, embedding, tied_logits=True) > np.log(V) + 5


def test_layer_norm_parameters_keep_their_names():
  """Attention applies its layer norm itself, but the norm's parameters keep the paths of the LayerNorm modules
  they were (a layer's pre_self_attention, pre_cross_attention, pre_ffn): older checkpoints restore."""
  import flax

  cfg = TransformerConfig.reference(vocab_size=V, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
                                    num_encoder_layers=1, num_decoder_layers=1, moe_interval=0)
  params = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), dummy_batch(1, 8)))["params"]
  paths = {"/".join(k): v.shape for k, v in flax.traverse_util.flatten_dict(flax.linen.unbox(params)).items()}
  norms = {path: shape for path, shape in paths.items() if "norm" in path or "/pre_" in path}
  layer = {"encoder/units/layer_0": ("pre_self_attention", "pre_ffn"),
           "decoder/units/layer_0": ("pre_self_attention", "pre_cross_attention", "pre_ffn")}
  want = {f"{stack}/final_norm/{p}": (32,) for stack in ("encoder", "decoder") for p in ("scale", "bias")}
  want |= {f"{prefix}/{norm}/{p}": (1, 32) for prefix, names in layer.items() for norm in names
           for p in ("scale", "bias")}
  assert norms == want


@pytest.mark.parametrize("unroll", [2, 3])
def test_scan_unroll_computes_the_same_with_fewer_loop_iterations(unroll):
  """model.scan_unroll runs `unroll` layer units per iteration of the scan's loop (3 units: 2 -> one iteration of
  two and the one left over, 3 -> all in one), with the same parameters, outputs and gradients."""
  cfg = TransformerConfig.reference(vocab_size=V, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
                                    num_encoder_layers=3, num_decoder_layers=3, moe_interval=0, dropout_rate=0.0)
  rng = np.random.default_rng(0)
  batch = {k: np.array(v) for k, v in dummy_batch(2, 8).items()}
  batch["inputs"] = rng.integers(3, V, (2, 8)).astype(np.int32)
  batch["targets"] = rng.integers(3, V, (2, 8)).astype(np.int32)
  params = Transformer(cfg).init(jax.random.key(0), batch)

  def loss(cfg, params):
    return jnp.mean(Transformer(cfg).apply(params, batch)[0] ** 2)

  unrolled = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, scan_unroll=unroll))
  assert jax.tree.structure(params) == jax.tree.structure(Transformer(unrolled).init(jax.random.key(0), batch))
  want, got = (jax.jit(jax.value_and_grad(functools.partial(loss, c)))(params) for c in (cfg, unrolled))
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7), got[1], want[1])
  trips = lambda c: [int(t) for t in re.findall(r'"known_trip_count":\{"n":"(\d+)"', jax.jit(  # noqa: E731
      functools.partial(loss, c)).lower(params).compile().as_text())]
  assert trips(cfg) == [3, 3] and trips(unrolled) == []  # XLA removes a loop of one iteration


def test_a_decoding_length_beyond_the_learned_positions_is_refused():
  """jnp.take past the table gives NaN embeddings, whose argmax is garbage: refused in one line, by eval.py and
  translate.py before the data is read and by the Translator itself."""
  cfg = TransformerConfig.reference(vocab_size=V, positions="learned", max_position=128)
  decode.Translator(cfg, None, max_len=128)
  with pytest.raises(ConfigError, match=r"a decoding length of 129 \(--max_decode_len\) exceeds model.max_position"
                                        r"=128, the learned positions"):
    decode.Translator(cfg, None, max_len=129)
  decode.check_length(dataclasses.replace(cfg.model, positions="sinusoidal"), 10_000)
