"""The reuse pools of ppo_ref.fast.workspace: an array is handed out again only when nobody holds
it; and through them, the recurrent fast path never overwrites a cache still held."""
import threading

import gymnasium as gym
import numpy as np

from ppo_ref.fast import workspace
from ppo_ref.config import PPOConfig
from ppo_ref.recurrent_policies import RecurrentPolicy


def test_free_arrays_are_reused_and_held_ones_are_not():
    # the pools hand out views of their buffers: the same memory is the same buffer
    a = workspace.empty("test.a", (3, 4), np.float64)
    first = a.ctypes.data
    b = workspace.empty("test.a", (3, 4), np.float64)
    assert not np.shares_memory(a, b)  # a is held
    del a
    c = workspace.empty("test.a", (3, 4), np.float64)
    assert c.ctypes.data == first  # free again: reused
    view = c[1:]
    del c
    d = workspace.empty("test.a", (3, 4), np.float64)
    assert not np.shares_memory(d, view) and not np.shares_memory(d, b)  # a view holds it
    assert workspace.empty("test.a", (3, 4), np.float32).dtype == np.float32
    assert workspace.empty("test.a", (2, 4), np.float64).shape == (2, 4)


def test_arrays_start_at_the_alignment_and_have_the_asked_layout():
    for shape, dtype in (((3, 4), np.float64), ((7,), np.float32), ((2, 0, 5), np.float64),
                         ((), np.float64)):
        for a in (workspace.empty("test.align", shape, dtype), workspace.aligned(shape, dtype),
                  workspace.aligned(shape, dtype, zeros=True)):
            assert a.size == 0 or a.ctypes.data % workspace.ALIGN == 0  # (no data: any)
            assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
            assert a.flags.writeable
    assert not workspace.aligned((4, 3), np.float64, zeros=True).any()
    assert workspace.aligned(5).shape == (5,) and workspace.aligned(5).dtype == np.float64


def test_pool_is_bounded_and_arrays_stay_distinct_beyond_it():
    held = [workspace.empty("test.bound", (5,), np.float64)
            for _ in range(workspace.MAX_PER_KEY + 3)]
    assert len({a.ctypes.data for a in held}) == len(held)
    for i, a in enumerate(held):
        a[:] = i
    for i, a in enumerate(held):
        assert np.all(a == i)


def test_pools_are_per_thread():
    mine = workspace.empty("test.thread", (7,), np.float64)
    mine_id = mine.ctypes.data
    del mine
    seen = []

    def other():
        seen.append(workspace.empty("test.thread", (7,), np.float64).ctypes.data)
    t = threading.Thread(target=other)
    t.start()
    t.join()
    # this thread's free array (alive in its pool) is not handed to the other thread
    assert seen[0] != mine_id
    assert workspace.empty("test.thread", (7,), np.float64).ctypes.data == mine_id


def test_recurrent_cache_held_across_another_evaluate_is_not_overwritten(rng):
    """Two evaluate calls with both caches alive: the first cache's backward gives the
    gradients it gives when run before the second evaluate (the pools hand the second call
    other arrays)."""
    config = PPOConfig(lstm_hidden_size=8, net_arch=(8,), n_envs=3, n_steps=5, batch_size=15)
    obs_space = gym.spaces.Box(-1.0, 1.0, (4,))
    policy = RecurrentPolicy(obs_space, gym.spaces.Discrete(3), config)
    params = policy.init_params(rng)
    T, n = 5, 3

    def batch(seed):
        g = np.random.default_rng(seed)
        return (g.standard_normal((T, n, 4)), g.integers(0, 3, (T, n)),
                policy.initial_state(n), g.random((T, n)) < 0.3)
    d = [rng.standard_normal((T, n)) for _ in range(3)]
    ev1 = policy.evaluate(params, *batch(1))
    expected = policy.backward(params, ev1.cache, *d).flat.copy()
    ev2 = policy.evaluate(params, *batch(2))  # ev1 still alive
    again = policy.backward(params, ev1.cache, *d).flat
    np.testing.assert_array_equal(again, expected)
    assert not np.array_equal(policy.backward(params, ev2.cache, *d).flat, expected)
