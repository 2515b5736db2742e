"""Checkpoint format (atomic, no pickle, clear errors) and exact resume of PPOTrainer."""
import json
import os
import zipfile

import numpy as np
import pytest

from ppo_ref.checkpoint import (CheckpointError, arrays_from_bytes, arrays_to_bytes,
                                generator_from_state, generator_state, load_checkpoint,
                                save_checkpoint)
from ppo_ref.config import PPOConfig
from ppo_ref.ppo import PPOTrainer


def test_arrays_roundtrip_bit_exact():
    rng = np.random.default_rng(0)
    arrays = {"f64": rng.standard_normal((3, 4)), "f32": rng.standard_normal(5).astype(np.float32),
              "i64": np.arange(7), "b": np.array([True, False]), "scalar": np.array(np.pi),
              "nan": np.array([np.nan, -np.inf, 0.0, -0.0]), "empty": np.zeros((0, 3))}
    back = arrays_from_bytes(arrays_to_bytes(arrays))
    assert set(back) == set(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert back[k].tobytes() == v.tobytes()


def test_object_arrays_are_refused():
    with pytest.raises(ValueError, match="object"):
        arrays_to_bytes({"x": np.array([{"a": 1}], dtype=object)})


def test_save_load_metadata_and_no_temp_files(tmp_path):
    path = tmp_path / "c.npz"
    save_checkpoint(path, {"w": np.ones(3)}, {"steps": 12, "name": "x"})
    save_checkpoint(path, {"w": np.zeros(3)}, {"steps": 13})  # replaces atomically
    arrays, meta = load_checkpoint(path)
    assert meta["steps"] == 13 and meta["format_version"] == 1
    np.testing.assert_array_equal(arrays["w"], np.zeros(3))
    assert os.listdir(tmp_path) == ["c.npz"]
    # loaded without pickle: the file holds only .npy members
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["__metadata__.npy", "w.npy"]


def test_generator_state_json_roundtrip():
    rng = np.random.default_rng(42)
    rng.random(10)
    state = json.loads(json.dumps(generator_state(rng)))
    clone = generator_from_state(state)
    np.testing.assert_array_equal(clone.random(100), rng.random(100))


def _valid_file(tmp_path):
    path = tmp_path / "c.npz"
    save_checkpoint(path, {"w": np.arange(1000.0)}, {"k": 1})
    return path, path.read_bytes()


@pytest.mark.parametrize("cut", [0, 10, 200, -50, -1])
def test_truncated_checkpoint_raises_clear_error(tmp_path, cut):
    path, data = _valid_file(tmp_path)
    path.write_bytes(data[:cut])
    with pytest.raises(CheckpointError, match="c.npz"):
        load_checkpoint(path)


def test_corrupted_checkpoint_raises_clear_error(tmp_path):
    path, data = _valid_file(tmp_path)
    bad = bytearray(data)
    start = data.index(b"w.npy") + 400  # inside the array payload: caught by the CRC-32
    bad[start] ^= 0xFF
    path.write_bytes(bytes(bad))
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(path)


def test_missing_or_foreign_files(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.npz")
    plain = tmp_path / "plain.npz"
    np.savez(plain, w=np.ones(2))
    with pytest.raises(CheckpointError, match="__metadata__"):
        load_checkpoint(plain)
    text = tmp_path / "text.npz"
    text.write_text("hello")
    with pytest.raises(CheckpointError):
        load_checkpoint(text)


def test_trainer_load_rejects_corrupt_file(tmp_path):
    path, data = _valid_file(tmp_path)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError):
        PPOTrainer.load(path)


def _params_equal(a, b):
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_exact_resume_cartpole_8k_plus_8k_equals_16k(tmp_path):
    """Stop at 8k of a 16k run, save, load, continue: bit-identical to an uninterrupted run.

    (The issue asks for 50k + 50k vs 100k; the default suite uses 8k + 8k vs 16k with the same
    zoo settings for time. ``validation``-style longer checks can call this with other sizes.)
    """
    cfg = PPOConfig.zoo_cartpole()
    full = PPOTrainer("CartPole-v1", cfg, seed=7)
    full_stats = []
    full.learn(16_384, lambda t, s: full_stats.append(s["policy_loss"]))

    part = PPOTrainer("CartPole-v1", cfg, seed=7)
    part_stats = []

    def stop_half(t, s):
        part_stats.append(s["policy_loss"])
        return t.num_timesteps < 8192
    part.learn(16_384, stop_half)
    assert part.num_timesteps == 8192
    path = tmp_path / "ckpt.npz"
    part.save(path)
    part.close()
    resumed = PPOTrainer.load(path)
    assert resumed.num_timesteps == 8192 and resumed.total_timesteps == 16_384
    resumed.learn(16_384, lambda t, s: part_stats.append(s["policy_loss"]))
    assert part_stats == full_stats
    assert _params_equal(resumed.params, full.params)
    assert _params_equal(resumed.adam_state["m"], full.adam_state["m"])
    assert resumed.n_episodes == full.n_episodes
    assert list(resumed.recent_returns) == list(full.recent_returns)


def test_exact_resume_with_normalization_and_gaussian_policy(tmp_path):
    cfg = PPOConfig(n_envs=2, n_steps=128, batch_size=64, n_epochs=2,
                    normalize_observations=True, normalize_rewards=True)
    full = PPOTrainer("Pendulum-v1", cfg, seed=3)
    full.learn(1024)
    part = PPOTrainer("Pendulum-v1", cfg, seed=3)
    part.learn(1024, lambda t, s: t.num_timesteps < 512)
    path = tmp_path / "ckpt.npz"
    part.save(path)
    resumed = PPOTrainer.load(path)
    np.testing.assert_array_equal(resumed.collector.obs_rms.mean, part.collector.obs_rms.mean)
    resumed.learn(1024)
    assert _params_equal(resumed.params, full.params)
    np.testing.assert_array_equal(resumed.collector.obs_rms.var, full.collector.obs_rms.var)
    assert resumed.collector.reward_normalizer.return_rms.var == full.collector.reward_normalizer.return_rms.var


def test_checkpoint_contents(tmp_path):
    tr = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(n_epochs=1), seed=0)
    tr.learn(512)
    path = tr.save(tmp_path / "c.npz")
    arrays, meta = load_checkpoint(path)
    assert meta["trainer"] == "PPOTrainer" and meta["env_id"] == "CartPole-v1"
    assert meta["num_timesteps"] == 512 and meta["exact_resume_limits"] == []
    assert PPOConfig.from_dict(meta["config"]) == tr.config
    for key in ("params/pi.w0", "adam/t", "adam/m.pi.w0", "collector/obs",
                "collector/episode_starts", "collector/episode_return", "state_json"):
        assert key in arrays


def test_foreign_or_random_files_are_not_ppo_ref_checkpoints(tmp_path):
    import zipfile
    from ppo_ref.checkpoint import CheckpointError, load_checkpoint
    random_bytes = tmp_path / "random.npz"
    random_bytes.write_bytes(np.random.default_rng(1).bytes(5000))
    npy = tmp_path / "array.npz"
    with open(npy, "wb") as fh:
        np.save(fh, np.arange(3.0))
    foreign_zip = tmp_path / "foreign.npz"
    with zipfile.ZipFile(foreign_zip, "w") as zf:
        zf.writestr("readme.txt", "hello")
    plain_npz = tmp_path / "plain.npz"
    np.savez(plain_npz, x=np.arange(3))
    for path in (random_bytes, npy, foreign_zip, plain_npz):
        with pytest.raises(CheckpointError, match="not a ppo_ref checkpoint") as info:
            load_checkpoint(path)
        assert str(path) in str(info.value) and "pickle" not in str(info.value)


def test_arrays_from_bytes_decodes_under_the_lock(monkeypatch):
    """The thread backend's actors decode broadcasts concurrently; np.load's header parsing
    (ast) is not thread-safe on CPython 3.11/3.12 (gh-106905: a rare SystemError "AST
    constructor recursion depth mismatch", seen once in CI), so decoding holds one lock. The
    race itself cannot be provoked on demand; this checks that np.load runs under the lock and
    that the lock is released afterwards, also after an error."""
    import ppo_ref.checkpoint as ck
    real_load = np.load
    seen = []

    def checking_load(*args, **kwargs):
        seen.append(ck._NPZ_LOCK.locked())
        return real_load(*args, **kwargs)

    monkeypatch.setattr(ck.np, "load", checking_load)
    arrays = {"w": np.arange(6.0).reshape(2, 3)}
    out = arrays_from_bytes(arrays_to_bytes(arrays))
    assert np.array_equal(out["w"], arrays["w"]) and seen == [True]
    assert not ck._NPZ_LOCK.locked()
    broken = bytearray(arrays_to_bytes(arrays))
    broken[-30:] = b"\0" * 30
    with pytest.raises(CheckpointError):
        arrays_from_bytes(bytes(broken))
    assert not ck._NPZ_LOCK.locked()
