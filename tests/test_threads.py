"""The kernels with parallel loops (``ppo_ref._numba``, "Threads"): the same bits on one thread
and on all of them, and safe when several Python threads call them at once, on numba's OpenMP
or TBB layer and on its workqueue layer (not thread-safe: there the loops are compiled plain);
the trainers' ``threads`` (checked, held during each iteration, restored after) and
``ppo-ref train --threads``."""
import hashlib
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

from ppo_ref import _numba
from ppo_ref.fast.flat import flatten_arrays
from ppo_ref.fast.lstm import StackedArrays, backward_stacked, forward_stacked
from ppo_ref.fast.mlp import layer_table, mlp_backward_pair, mlp_forward_pair
from ppo_ref.fast.optim import clipped_adam_step


def parallel_outputs(seed: int) -> str:
    """SHA-256 of what every kernel with a parallel loop writes, on inputs drawn from ``seed``:
    both LSTMs' forward and BPTT, two towers' forward and backward, one clipped Adam step."""
    rng = np.random.default_rng(seed)
    out = []
    L, T, N, D, H = 2, 16, 8, 3, 32
    w_ih, w_hh = 0.4 * rng.normal(size=(L, 4 * H, D)), 0.3 * rng.normal(size=(L, 4 * H, H))
    b, x = 0.5 * rng.normal(size=(L, 4 * H)), rng.normal(size=(T, N, D))
    h0, c0 = rng.normal(size=(L, N, H)), rng.normal(size=(L, N, H))
    keep = np.ones((T + 1, N))
    keep[:-1] -= rng.random((T, N)) < 0.3
    arrays = StackedArrays.empty(L, T, N, D, H, np.float64)
    fwd = forward_stacked(w_ih, w_hh, b, x, h0, c0, keep, arrays)
    grads = [np.empty_like(w_ih), np.empty_like(w_hh), np.empty_like(b)]
    backward_stacked(w_hh, x, *fwd[1:], keep, rng.normal(size=(L, T, N, H)), *grads, arrays)
    out += list(fwd) + grads

    params = {f"{tower}.{k}{i}": rng.normal(size=shape)
              for tower, sizes in (("pi", (D, 16, 2)), ("vf", (D, 16, 1)))
              for i in range(2)
              for k, shape in (("w", (sizes[i + 1], sizes[i])), ("b", (sizes[i + 1],)))}
    flat = flatten_arrays(params)
    rows = 64
    towers = []
    for tower in ("pi", "vf"):
        table = layer_table(flat.layout, flat, tower + ".", 2)
        towers.append((rng.normal(size=(rows, D)), np.empty(rows * int(table[:, 2].sum())),
                       table, rng.normal(size=(rows, int(table[-1, 2]))), np.zeros((rows, D))))
    (x0, a0, t0, dy0, dx0), (x1, a1, t1, dy1, dx1) = towers
    mlp_forward_pair(flat.flat, True, x0, t0, a0, x1, t1, a1)
    g = np.zeros(flat.flat.size)
    mlp_backward_pair(flat.flat, True, g, x0, a0, t0, dy0, dx0, x1, a1, t1, dy1, dx1)
    out += [a0, a1, g, dx0, dx1]

    state = {"t": 3, "m": flatten_arrays({k: 0.1 * rng.normal(size=v.shape)
                                          for k, v in params.items()}, flat.layout),
             "v": flatten_arrays({k: rng.random(v.shape) for k, v in params.items()},
                                 flat.layout)}
    grads = flatten_arrays({k: rng.normal(size=v.shape) for k, v in params.items()}, flat.layout)
    p, state, norm = clipped_adam_step(flat, grads, state, max_norm=0.5, lr=1e-2)
    out += [p.flat, state["m"].flat, state["v"].flat, np.float64(norm)]

    digest = hashlib.sha256()
    for a in out:
        digest.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return digest.hexdigest()


def test_same_bits_on_one_thread_and_on_all():
    n = numba.config.NUMBA_NUM_THREADS
    if n < 2 or not _numba.PARALLEL_LOOPS:
        pytest.skip("the loops run on one thread here (one CPU, or plain loops): nothing to "
                    "compare; the subprocess test below runs two threads on any machine")
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = [parallel_outputs(seed) for seed in range(3)]
        numba.set_num_threads(n)
        every = [parallel_outputs(seed) for seed in range(3)]
    finally:
        numba.set_num_threads(before)
    assert one == every


_CONCURRENT = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, {tests!r})
    from ppo_ref import _numba
    from test_threads import parallel_outputs
    results = []
    def work():
        results.extend(parallel_outputs(seed) for seed in (0, 1) for _ in range(10))
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(_numba.PARALLEL_LOOPS, sorted(set(results)))
""")


@pytest.mark.parametrize("layer", ["default", "workqueue"])
def test_three_threads_at_once_on_any_threading_layer(layer):
    """Three Python threads run the parallel kernels at once, with two numba threads each. On
    ``workqueue`` numba would end the process on such a call of a parallel loop: there
    ``PARALLEL_LOOPS`` is False and the plain loops run, with the same bits."""
    env = dict(os.environ, NUMBA_THREADING_LAYER=layer, NUMBA_NUM_THREADS="2")
    env.pop("NUMBA_THREADING_LAYER_PRIORITY", None)
    script = _CONCURRENT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    parallel, hashes = run.stdout.strip().split(" ", 1)
    if layer == "workqueue":
        assert parallel == "False"
    elif os.environ.get("NUMBA_THREADING_LAYER", "default") == "default" \
            and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
        assert parallel == str(_numba.PARALLEL_LOOPS)   # the layer this process runs on
    assert hashes == str(sorted({parallel_outputs(0), parallel_outputs(1)}))


# -- the trainers' ``threads`` -----------------------------------------------------------------

def _recurrent_trainer(threads):
    from ppo_ref.config import PPOConfig
    from ppo_ref.recurrent_ppo import RecurrentPPOTrainer
    config = PPOConfig(n_envs=4, n_steps=16, batch_size=32, n_epochs=2, lstm_hidden_size=16,
                       lstm_shared=False, net_arch=(16,))
    return RecurrentPPOTrainer("ppo_ref/CartPoleNoVel-v1", config, seed=5, threads=threads)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", numba.config.NUMBA_NUM_THREADS + 1])
def test_trainer_threads_is_checked(bad):
    from ppo_ref.ppo import PPOTrainer
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
    numba's: the same parameters bit for bit; the calling thread's setting is put back."""
    n = numba.config.NUMBA_NUM_THREADS
    if n < 2 or not _numba.PARALLEL_LOOPS:
        pytest.skip("the loops run on one thread here: nothing to compare")
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
    from ppo_ref import cli
    assert cli.main(["train", "--threads", "0", "--total-timesteps", "256",
                     "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--threads must be an integer in [1," in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
