"""The compiled twins called again and again, and from several Python threads at once (the
actor-learner's thread backend, two trainers in one process): a result the caller holds is
never overwritten by a later call, and every thread gets the bits one thread gets. Then the
trainers' ``threads`` (numba threads of each iteration: checked, held during each iteration,
restored after, the same bits for any count) and ``ppo-ref train --threads``.
"""
import hashlib
import threading

import numba
import numpy as np
import pytest

from ppo_ref import _numba
from ppo_ref.spec.lstm import lstm_init
from ppo_ref.spec.networks import actor_critic_init
from ppo_ref.spec.recurrent_networks import LSTMStates, recurrent_actor_critic_init
from ppo_ref.tiers import tier_for

FAST = tier_for("fast")


def _jittered(rng, params, scale=0.3):
    return {k: v + scale * rng.standard_normal(v.shape) for k, v in params.items()}


def _passes(seed: int, dtype=np.float64):
    """``{name: (forward(), backward(cache))}`` of the compiled network twins on inputs drawn
    from ``seed``: calling ``forward`` runs the forward pass and returns ``(outputs, cache)``,
    ``backward(cache)`` the backward pass on that cache, with fixed upstream gradients."""
    rng = np.random.default_rng(seed)
    cast = lambda d: {k: v.astype(dtype) for k, v in d.items()}  # noqa: E731
    T, N, D, H = 8, 6, 3, 16
    net = cast(_jittered(rng, actor_critic_init(rng, D, 2, net_arch=(32, 32))))
    obs = rng.standard_normal((40, D)).astype(dtype)
    d_out, d_v = rng.standard_normal((40, 2)).astype(dtype), rng.standard_normal(40).astype(dtype)
    lstm = cast(_jittered(rng, lstm_init(rng, D, H)))
    x = rng.standard_normal((T, N, D)).astype(dtype)
    h0, c0 = (rng.standard_normal((N, H)).astype(dtype) for _ in range(2))
    starts = rng.random((T, N)) < 0.2
    dh = rng.standard_normal((T, N, H)).astype(dtype)
    rnn = cast(_jittered(rng, recurrent_actor_critic_init(rng, D, 2, hidden_size=H,
                                                          net_arch=(16,))))
    state = LSTMStates(*rng.standard_normal((2, 2, N, H)).astype(dtype))
    rd_out = rng.standard_normal((T, N, 2)).astype(dtype)
    rd_v = rng.standard_normal((T, N)).astype(dtype)

    def ac_forward():
        out, values, cache = FAST.networks.actor_critic_forward(net, obs)
        return (out, values), cache

    def lstm_forward():
        h_seq, final, cache = FAST.lstm.lstm_forward(lstm, x, h0, c0, starts)
        return (h_seq,) + tuple(final), cache

    def rnn_forward():
        out, values, final, cache = FAST.recurrent_networks.recurrent_actor_critic_forward(
            rnn, x, state, starts, "tanh", False)
        return (out, values) + tuple(final), cache

    return {
        "networks": (ac_forward, lambda cache: FAST.networks.actor_critic_backward(
            net, cache, d_out, d_v)),
        "lstm": (lstm_forward, lambda cache: FAST.lstm.lstm_backward(lstm, cache, dh)),
        "recurrent_networks": (rnn_forward, lambda cache: (
            FAST.recurrent_networks.recurrent_actor_critic_backward(rnn, cache, rd_out, rd_v))),
    }


def _arrays(tree):
    """Every array of a nested result (tuples, lists, dicts), in a fixed order."""
    if isinstance(tree, np.ndarray):
        return [tree]
    if isinstance(tree, dict):
        return [a for k in sorted(tree) for a in _arrays(tree[k])]
    if isinstance(tree, (tuple, list)):
        return [a for item in tree for a in _arrays(item)]
    return []


def _digest(tree) -> str:
    digest = hashlib.sha256()
    for a in _arrays(tree):
        digest.update(str(a.dtype).encode() + str(a.shape).encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()


def work(seed: int) -> str:
    """SHA-256 of what the compiled twins compute on inputs drawn from ``seed``: the network
    passes of :func:`_passes` in float64 and float32, the acting steps, clipping and Adam."""
    out = []
    for dtype in (np.float64, np.float32):
        for forward, backward in _passes(seed, dtype).values():
            outputs, cache = forward()
            out.append((outputs, backward(cache)))
    rng = np.random.default_rng(seed)
    rnn = _jittered(rng, recurrent_actor_critic_init(rng, 3, 2, hidden_size=8, net_arch=(8,),
                                                     lstm_shared=True))
    state = LSTMStates(*rng.standard_normal((2, 1, 5, 8)))
    out.append(FAST.recurrent_networks.recurrent_actor_critic_step(
        rnn, rng.standard_normal((5, 3)), state, rng.random(5) < 0.5, "tanh", True))
    params = _jittered(rng, actor_critic_init(rng, 3, 2))
    grads = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    clipped, norm = FAST.optim.clip_by_global_norm(grads, 0.5)
    state = {"t": 0, "m": {k: np.zeros_like(v) for k, v in params.items()},
             "v": {k: np.zeros_like(v) for k, v in params.items()}}
    out.append((FAST.optim.adam_update(params, clipped, state, lr=1e-3), np.float64(norm)))
    return _digest(out)


@pytest.mark.parametrize("name", ["networks", "lstm", "recurrent_networks"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_results_the_caller_holds_are_never_overwritten(name, dtype):
    """The twins reuse their arrays between calls; they never reuse one the caller still
    holds. The results and cache of a first call, kept while more calls of the same shapes
    run (some of their results kept too, some dropped), are unchanged, and the backward pass
    of the kept cache gives the bits of a fresh forward and backward."""
    forward, backward = _passes(3, dtype)[name]
    outputs, cache = forward()
    kept = [a.copy() for a in _arrays((outputs, cache))]
    other_forward, other_backward = _passes(4, dtype)[name]
    held = []
    for i in range(8):   # more calls than the arrays a twin keeps for one shape
        o, c = other_forward()
        g = other_backward(c)
        if i % 2:
            held.append((o, c, g))
    assert all(np.array_equal(a, b) for a, b in zip(_arrays((outputs, cache)), kept))
    grads = backward(cache)
    fresh_outputs, fresh_cache = forward()
    assert _digest(grads) == _digest(backward(fresh_cache))
    assert _digest(outputs) == _digest(fresh_outputs)


def test_twins_called_from_several_threads_at_once_give_the_bits_of_one_thread():
    """Three Python threads run the compiled twins at once (they release the GIL), each
    several times: every result is the one a single thread computes."""
    expected = {seed: work(seed) for seed in (0, 1)}
    results, errors = [], []

    def run():
        try:
            results.extend((seed, work(seed)) for _ in range(2) for seed in (0, 1))
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 3 * 2 * 2
    assert all(digest == expected[seed] for seed, digest in results)


# -- the trainers' ``threads`` -----------------------------------------------------------------

def _recurrent_trainer(threads):
    from ppo_ref import PPOConfig, RecurrentPPOTrainer
    config = PPOConfig(n_envs=4, n_steps=16, batch_size=32, n_epochs=2, lstm_hidden_size=16,
                       lstm_shared=False, net_arch=(16,))
    return RecurrentPPOTrainer("ppo_ref/CartPoleNoVel-v1", config, seed=5, threads=threads)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", numba.config.NUMBA_NUM_THREADS + 1])
def test_trainer_threads_is_checked(bad):
    from ppo_ref import PPOTrainer
    with pytest.raises(ValueError, match="threads must be None or an integer in"):
        PPOTrainer("CartPole-v1", threads=bad)
    trainer = PPOTrainer("CartPole-v1")
    try:
        with pytest.raises(ValueError, match="threads must be"):
            trainer.threads = bad
        assert trainer.threads == 1
    finally:
        trainer.close()


def test_trainer_threads_give_the_same_bits_and_are_restored():
    """Two updates of a recurrent trainer with separate LSTMs on one thread and on all of
    numba's: the same parameters bit for bit; the number is held during collection and the
    update, and the calling thread's setting is put back after each iteration."""
    n = numba.config.NUMBA_NUM_THREADS
    if n < 2 or not _numba.PARALLEL_LOOPS:
        pytest.skip("numba runs one thread here: nothing to compare")
    before = numba.get_num_threads()
    results = []
    for threads in (1, n):
        trainer = _recurrent_trainer(threads)
        try:
            seen = []

            def watched(method):
                def run(*args):
                    seen.append(numba.get_num_threads())
                    return method(*args)
                return run
            trainer.collect_rollout = watched(trainer.collect_rollout)
            trainer.train_on = watched(trainer.train_on)
            trainer.learn(2 * 4 * 16)
            assert seen == [threads] * 4                 # held during collection and updates
            assert numba.get_num_threads() == before      # and restored after each iteration
            trainer.predict(np.zeros(4))    # ppo_ref/CartPoleNoVel-v1 observes 4 numbers
            assert numba.get_num_threads() == before
            results.append(np.concatenate([np.ravel(v) for _, v in sorted(trainer.params.items())]))
        finally:
            trainer.close()
    np.testing.assert_array_equal(results[0], results[1])


def test_kernel_threads_restores_on_error_and_none_changes_nothing():
    from ppo_ref.train.ppo import kernel_threads
    before = numba.get_num_threads()
    with pytest.raises(RuntimeError):
        with kernel_threads(np.int64(1)):
            if _numba.PARALLEL_LOOPS:
                assert numba.get_num_threads() == 1
            raise RuntimeError("inside")
    assert numba.get_num_threads() == before
    with kernel_threads(None):
        assert numba.get_num_threads() == before
    with pytest.raises(ValueError, match="n_threads must be"):
        with kernel_threads(np.bool_(True)):
            pass


def test_cli_refuses_a_bad_threads_value(tmp_path, capsys):
    from ppo_ref.cli import main
    assert main(["train", "--threads", "0", "--total-timesteps", "256",
                 "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--threads must be an integer in [1," in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
