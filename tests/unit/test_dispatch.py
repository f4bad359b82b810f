"""Dispatch and combine: each kept assignment's token lands in its expert's slot (or, grouped, in a row of its
expert's block), outputs come back weighted by its gate; the einsum (the paper's), index and grouped dispatchers
agree."""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gshard_mt.moe import dispatch, gating
from gshard_mt.moe.dispatch import (
  EinsumDispatcher,
  GroupedDispatcher,
  IndexDispatcher,
  make_dispatcher,
  take_rows,
  take_slots,
)

G, S, E, C, M = 3, 20, 5, 3, 6  # C = 3 < 2S/E: some assignments are dropped, every slot is filled
ROOMY = 7  # a capacity with some assignments dropped and some slots left empty
GATHER_BACKWARD = functools.partial(IndexDispatcher, gather_backward=True)  # moe.dispatch='index_gather'


@functools.cache
def routing_and_inputs(capacity=C):
  logits = jax.random.normal(jax.random.key(2), (G, S, E)) * 2
  routing = jax.jit(gating.top2_gating, static_argnums=1)(logits, capacity)  # one compilation, not op by op
  x = jax.random.normal(jax.random.key(3), (G, S, M))
  y = jax.random.normal(jax.random.key(4), (E, G, capacity, M))
  return routing, x, y


def reference(routing, x, y):
  """Loops over the assignments: (dispatched [E, G, C, M], combined [G, S, M])."""
  expert, slot, weight, kept = (np.asarray(a) for a in (routing.expert_index, routing.slot, routing.weight,
                                                         routing.kept))
  x, y = np.asarray(x), np.asarray(y)
  dispatched, combined = np.zeros((E, G, routing.capacity, M)), np.zeros((G, S, M))
  for g in range(G):
    for s in range(S):
      for k in range(2):
        if kept[g, s, k]:
          e, c = expert[g, s, k], slot[g, s, k]
          assert not dispatched[e, g, c].any()  # one token per slot
          dispatched[e, g, c] = x[g, s]
          combined[g, s] += weight[g, s, k] * y[e, g, c]
  return dispatched, combined


def occupied(routing) -> np.ndarray:
  """bool [E, G, C]: the slots a kept assignment fills."""
  expert, slot, kept = (np.asarray(a) for a in (routing.expert_index, routing.slot, routing.kept))
  filled = np.zeros((E, G, routing.capacity), bool)
  for g, s, k in zip(*np.nonzero(kept)):
    filled[expert[g, s, k], g, slot[g, s, k]] = True
  return filled


@pytest.mark.parametrize("capacity", [C, ROOMY])
@pytest.mark.parametrize("dispatcher", [EinsumDispatcher, IndexDispatcher, GATHER_BACKWARD])
def test_tokens_go_to_their_slots_and_come_back_weighted(dispatcher, capacity):
  routing, x, y = routing_and_inputs(capacity)
  kept = np.asarray(routing.kept)
  assert 0 < kept.sum() < kept.size  # some assignments kept, some dropped
  dispatched, combined = reference(routing, x, y)
  filled = occupied(routing)
  assert (filled.all() if capacity == C else 0 < filled.sum() < filled.size)  # ROOMY: some slots empty
  if dispatcher is not EinsumDispatcher:  # the index dispatchers leave their group's last token in an empty slot
    dispatched = np.where(filled[..., None], dispatched, np.asarray(x)[None, :, None, S - 1])
  np.testing.assert_allclose(dispatcher(routing).dispatch(x), dispatched, atol=1e-6)
  np.testing.assert_allclose(dispatcher(routing).combine(y), combined, atol=1e-5)


def test_dispatchers_agree_on_filled_slots():
  routing, x, y = routing_and_inputs(ROOMY)
  filled = occupied(routing)[..., None]
  np.testing.assert_allclose(IndexDispatcher(routing).dispatch(x) * filled, EinsumDispatcher(routing).dispatch(x),
                             atol=1e-6)
  np.testing.assert_allclose(IndexDispatcher(routing).combine(y), EinsumDispatcher(routing).combine(y), atol=1e-6)


@pytest.mark.parametrize("capacity", [C, ROOMY])
@pytest.mark.parametrize("dispatcher", [EinsumDispatcher, IndexDispatcher, GATHER_BACKWARD])
def test_gradients_go_back_to_their_tokens_and_slots(dispatcher, capacity):
  """The gradients of dispatch and combine by loops over the assignments: a kept assignment's slot sends its
  gradient to its token, and a token's gradient reaches its slots weighted; dropped assignments and empty slots
  get none."""
  routing, x, y = routing_and_inputs(capacity)
  # An empty slot's cotangent is zero, as in the layer (no assignment reads it back with a nonzero weight).
  u = jax.random.normal(jax.random.key(5), (E, G, capacity, M)) * occupied(routing)[..., None]
  v = jax.random.normal(jax.random.key(6), (G, S, M))
  dx = jax.grad(lambda x: jnp.sum(dispatcher(routing).dispatch(x) * u))(x)
  dy = jax.grad(lambda y: jnp.sum(dispatcher(routing).combine(y) * v))(y)
  expert, slot, weight, kept = (np.asarray(a) for a in (routing.expert_index, routing.slot, routing.weight,
                                                         routing.kept))
  want_dx, want_dy = np.zeros((G, S, M)), np.zeros((E, G, capacity, M))
  for g, s, k in zip(*np.nonzero(kept)):
    e, c = expert[g, s, k], slot[g, s, k]
    want_dx[g, s] += np.asarray(u)[e, g, c]
    want_dy[e, g, c] += weight[g, s, k] * np.asarray(v)[g, s]
  np.testing.assert_allclose(dx, want_dx, atol=1e-5)
  np.testing.assert_allclose(dy, want_dy, atol=1e-5)


@pytest.mark.parametrize("capacity", [C, ROOMY])
def test_kept_assignments_have_slots_of_their_own(capacity):
  """What the combine's backward scatter promises XLA (`unique_indices`, `take_slots`): within a group, the
  indices it is given are all different, a kept assignment's inside the buffers and a dropped one's outside.
  With a spy in take_slots' place."""
  routing, _, y = routing_and_inputs(capacity)
  given = []

  def spy(y, slot, num_experts, capacity):
    given.append(np.asarray(slot))
    return take_slots(y, slot, num_experts, capacity)

  with mock.patch.object(dispatch, "take_slots", spy):
    IndexDispatcher(routing).combine(y)
  flat = given[0].transpose(1, 2, 0).reshape(G, -1)  # [K, G, S] -> per group, in (s, k) order
  kept = np.asarray(routing.kept).reshape(G, -1)
  assert (~kept).any() and (flat[~kept] >= E * capacity).all() and (flat[kept] < E * capacity).all()
  assert all(len(set(flat[g])) == flat.shape[1] for g in range(G))


def test_take_rows_gathers_its_gradient_from_the_readers_it_is_given():
  x = jax.random.normal(jax.random.key(7), (4, 3))
  index = jnp.array([[2, 0], [2, 3], [0, 0]], jnp.int32)  # positions 0..5 read rows 2, 0, 2, 3, 0, 0
  every = jnp.array([[1, 4, 5], [6, 6, 6], [0, 2, 6], [3, 6, 6]], jnp.int32)  # 6 = no reader
  dout = jax.random.normal(jax.random.key(8), (3, 2, 3))
  np.testing.assert_array_equal(take_rows(x, index, every), x[index])
  grad = lambda readers: jax.grad(lambda x: jnp.sum(take_rows(x, index, readers) * dout))(x)  # noqa: E731
  np.testing.assert_allclose(grad(every), jax.grad(lambda x: jnp.sum(x[index] * dout))(x), atol=1e-6)
  # A reader left out (position 5 of row 0, as a dropped assignment weighted 0 would be) sends nothing.
  fewer = every.at[0, 2].set(6)
  rows = np.asarray(dout).reshape(6, 3)
  np.testing.assert_allclose(grad(fewer)[0], rows[1] + rows[4], atol=1e-6)
  np.testing.assert_allclose(grad(fewer)[1:], grad(every)[1:], atol=1e-6)


def test_grouped_rows_are_the_kept_assignments_sorted_by_expert():
  routing, x, _ = routing_and_inputs()
  grouped = GroupedDispatcher(routing)
  R = grouped.num_rows
  assert R == min(G * S * 2, G * E * C)
  expert, kept = np.asarray(routing.expert_index), np.asarray(routing.kept)
  sizes = np.asarray(grouped.group_sizes)
  counts = np.array([(expert[kept] == e).sum() for e in range(E)])
  # Every row belongs to an expert: the rows no kept assignment uses are the last expert's.
  np.testing.assert_array_equal(sizes, counts + np.eye(E, dtype=int)[-1] * (R - kept.sum()))
  rows = np.asarray(grouped.dispatch(x))
  starts = np.concatenate([[0], np.cumsum(sizes)])
  seen = set()
  for g in range(G):
    for s in range(S):
      for k in range(2):
        if kept[g, s, k]:
          matches = [i for i in range(starts[expert[g, s, k]], starts[expert[g, s, k] + 1])
                     if i not in seen and np.array_equal(rows[i], x[g, s])]
          assert matches  # the token sits in a row of its expert's block, one row per assignment
          seen.add(matches[0])
  assert len(seen) == kept.sum()


def test_grouped_combine_weights_each_assignments_row():
  routing, x, _ = routing_and_inputs()
  grouped = GroupedDispatcher(routing)
  y = grouped.dispatch(x) * 3.0  # the "expert output" of a row: 3 x its token, so combine must give
  expected = 3.0 * np.asarray(routing.weight).sum(-1)[..., None] * np.asarray(x)  # sum_k weight_k x 3 x token
  np.testing.assert_allclose(grouped.combine(y), expected, atol=1e-5)
  # Through the expert buffers of the other dispatchers: the same tokens, the same weights.
  _, combined = reference(routing, x, np.asarray(EinsumDispatcher(routing).dispatch(x)) * 3.0)
  np.testing.assert_allclose(grouped.combine(y), combined, atol=1e-5)


def test_make_dispatcher():
  routing, _, _ = routing_and_inputs()
  assert isinstance(make_dispatcher("index", routing), IndexDispatcher)
  assert not make_dispatcher("index", routing).gather_backward
  assert make_dispatcher("index_gather", routing).gather_backward
  assert isinstance(make_dispatcher("einsum", routing), EinsumDispatcher)
  assert isinstance(make_dispatcher("grouped", routing), GroupedDispatcher)
