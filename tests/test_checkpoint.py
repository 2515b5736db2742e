"""Checkpoint format (atomic, no pickle, clear errors) and exact resume of PPOTrainer."""
import json
import os
import zipfile

import numpy as np
import pytest

from ppo_ref.config import PPOConfig
from ppo_ref.io.checkpoint import (CheckpointError, arrays_from_bytes, arrays_to_bytes,
                                   generator_from_state, generator_state, load_checkpoint,
                                   save_checkpoint)
from ppo_ref.train.ppo import PPOTrainer


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


def test_exact_resume_with_normalization_and_gaussian_policy(resumed_half_way):
    cfg = PPOConfig(n_envs=2, n_steps=128, batch_size=64, n_epochs=2,
                    normalize_observations=True, normalize_rewards=True)
    full, part, resumed = resumed_half_way(cfg)
    np.testing.assert_array_equal(resumed.collector.obs_moments.mean, part.collector.obs_moments.mean)
    resumed.learn(1024)
    assert _params_equal(resumed.params, full.params)
    np.testing.assert_array_equal(resumed.collector.obs_moments.var, full.collector.obs_moments.var)
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
    race itself cannot be provoked on demand; this checks that the header parser runs under the
    lock and that the lock is released afterwards, also after an error."""
    import ppo_ref.io.checkpoint as ck
    real_parse = np.lib.format.read_array_header_1_0
    seen = []

    def checking_parse(*args, **kwargs):
        seen.append(ck._NPZ_LOCK.locked())
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", checking_parse)
    arrays = {"w": np.arange(6.0).reshape(2, 3)}
    out = arrays_from_bytes(arrays_to_bytes(arrays))
    assert np.array_equal(out["w"], arrays["w"]) and seen == [True]
    assert not ck._NPZ_LOCK.locked()
    broken = bytearray(arrays_to_bytes(arrays))
    broken[-30:] = b"\0" * 30
    with pytest.raises(CheckpointError):
        arrays_from_bytes(bytes(broken))
    assert not ck._NPZ_LOCK.locked()


# -- integrity: every member checked before it is parsed; shapes, dtypes and values vetted ---------

def _members(path):
    """``{name: bytes}`` of a checkpoint's zip members (in order)."""
    with zipfile.ZipFile(path) as zf:
        return {info.filename: zf.read(info.filename) for info in zf.infolist()}


def _write_members(path, members, compress=zipfile.ZIP_STORED):
    """Write ``members`` as a zip with correct CRCs (a crafted, not a damaged, file)."""
    with zipfile.ZipFile(path, "w", compression=compress) as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _npy(arr) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A checkpoint of a 256-step CartPole run (one update) and the trainer's current arrays."""
    path = tmp_path_factory.mktemp("ck") / "c.npz"
    tr = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(n_epochs=1, n_envs=2, n_steps=64,
                                                           batch_size=64), seed=0)
    tr.learn(128)
    tr.save(path)
    tr.close()
    return path


@pytest.fixture(scope="module")
def small_lstm_run(tmp_path_factory):
    """A checkpoint of a 32-step LSTM CartPole run (one update)."""
    from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer
    path = tmp_path_factory.mktemp("ck") / "lstm.npz"
    tr = RecurrentPPOTrainer("CartPole-v1", PPOConfig(n_envs=2, n_steps=16, batch_size=16,
                                                      n_epochs=1), seed=0)
    tr.learn(32)
    tr.save(path)
    tr.close()
    return path


def test_a_flipped_bit_in_a_npy_header_is_caught_by_the_crc(small_run, tmp_path):
    """A header that claims fewer rows made NumPy stop reading early, so the zip CRC was never
    checked and a (64, 64) array loaded as (44, 64): every member's CRC is now checked first."""
    data = bytearray(small_run.read_bytes())
    arrays, _ = load_checkpoint(small_run)
    shape = arrays["params/pi.w1"].shape
    header = f"'shape': ({shape[0]}, {shape[1]})".encode()
    at = data.index(header, data.index(b"params/pi.w1.npy"))
    fake = f"'shape': ({shape[0] - 20}, {shape[1]})".encode()
    assert len(fake) == len(header)
    data[at:at + len(header)] = fake
    bad = tmp_path / "flipped.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="flipped.npz"):
        load_checkpoint(bad)


def test_a_crafted_header_with_a_valid_crc_that_leaves_bytes_unread_is_refused(tmp_path):
    members = {"__metadata__.npy": _npy(np.frombuffer(b'{"format_version": 1}', np.uint8)),
               "w.npy": _npy(np.arange(64.0).reshape(8, 8))}
    members["w.npy"] = members["w.npy"].replace(b"'shape': (8, 8)", b"'shape': (4, 8)")
    path = tmp_path / "short.npz"
    _write_members(path, members)
    with pytest.raises(CheckpointError, match="w"):
        load_checkpoint(path)


_HEADER = b"\x93NUMPY\x01\x00"


def _raw_npy(header_text: bytes, payload: bytes = b"") -> bytes:
    pad = 64 - (len(_HEADER) + 2 + len(header_text) + 1) % 64
    header = header_text + b" " * pad + b"\n"
    return _HEADER + len(header).to_bytes(2, "little") + header + payload


@pytest.mark.parametrize("header", [
    b"{'descr': '<f8', 'fortran_order': False, 'shape': " + b"(" * 5000 + b")" * 5000 + b", }",
    b"{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2 , }",
    b"{'descr': '<f8', 'fortran_order': False, 'shape': ('''",
    b"{'descr': [('a', '<f8', (" + b"9" * 40 + b",))], 'fortran_order': False, 'shape': (1,), }",
    b"{'descr': 'x9', 'fortran_order': False, 'shape': (1,), }",
    b"{'descr': '<f8', 'fortran_order': 3, 'shape': (1,), }",
    b"{'descr': '<f8', 'fortran_order': False, 'shape': (-1,), }",
    b"{'descr': '<f8', 'fortran_order': False, 'shape': (10**12, 10**12), }",
    b"{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999, 99999999999), }",
    b"{'descr': {'names': ['a'], 'formats': ['<f8'], 'offsets': [2**62]}, "
    b"'fortran_order': False, 'shape': (1,), }",
    b"{'descr': 'O', 'fortran_order': False, 'shape': (1,), }",
    b"{'descr': '<M8[s]', 'fortran_order': False, 'shape': (1,), }",
])
def test_crafted_npy_headers_give_a_checkpoint_error(tmp_path, header):
    """Whatever a member's header says, loading raises CheckpointError (not NotImplementedError,
    RuntimeError, tokenize.TokenError, RecursionError, TypeError, MemoryError, ...)."""
    members = {"__metadata__.npy": _npy(np.frombuffer(b'{"format_version": 1}', np.uint8)),
               "w.npy": _raw_npy(header, b"\0" * 8)}
    path = tmp_path / "crafted.npz"
    _write_members(path, members)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value) and "crafted.npz" in str(info.value)


@pytest.mark.parametrize("metadata", [
    b"[" * 100_000 + b"]" * 100_000,              # RecursionError in json
    b'{"format_version": 1, "n": ' + b"9" * 5000 + b"}",  # int digits limit: ValueError
    b"\xff\xfe",                                    # not UTF-8
])
def test_crafted_metadata_gives_a_checkpoint_error(tmp_path, metadata):
    path = tmp_path / "meta.npz"
    _write_members(path, {"__metadata__.npy": _npy(np.frombuffer(metadata, np.uint8))})
    with pytest.raises(CheckpointError, match="meta.npz"):
        load_checkpoint(path)


def test_every_single_byte_corruption_gives_a_checkpoint_error_or_the_same_arrays(tmp_path):
    """Flip each byte of a small checkpoint in turn: the load either fails with CheckpointError
    or (a byte the format does not read, e.g. a timestamp) returns bit-identical arrays."""
    path, data = _valid_file(tmp_path)
    save_checkpoint(path, {"w": np.arange(6.0).reshape(2, 3)}, {"k": 1})
    data = path.read_bytes()
    good, good_meta = load_checkpoint(path)
    bad = tmp_path / "bad.npz"
    for i in range(len(data)):
        for mask in (0xFF, 0x01):
            flipped = bytearray(data)
            flipped[i] ^= mask
            bad.write_bytes(bytes(flipped))
            try:
                arrays, meta = load_checkpoint(bad)
            except CheckpointError as exc:
                assert "\n" not in str(exc)
                continue
            assert meta == good_meta and set(arrays) == set(good), i
            assert all(arrays[k].dtype == good[k].dtype and arrays[k].shape == good[k].shape
                       and arrays[k].tobytes() == good[k].tobytes() for k in good), i


def test_compressed_or_oversized_members_are_refused_before_they_are_read(tmp_path, monkeypatch):
    """A deflated member could expand to gigabytes on every load (ppo_ref writes members
    stored); a stored member larger than the cap is refused from its zip header, unread."""
    members = {"__metadata__.npy": _npy(np.frombuffer(b'{"format_version": 1}', np.uint8)),
               "w.npy": _npy(np.zeros(2_000_000))}
    path = tmp_path / "deflated.npz"
    _write_members(path, members, compress=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 100_000
    with pytest.raises(CheckpointError, match="compressed"):
        load_checkpoint(path)
    path = tmp_path / "big.npz"
    _write_members(path, members)
    import ppo_ref.io.checkpoint as ck
    read = []
    real_read = zipfile.ZipFile.read
    monkeypatch.setattr(zipfile.ZipFile, "read",
                        lambda self, name, *a: read.append(name) or real_read(self, name, *a))
    with pytest.raises(CheckpointError, match="w.npy.*bytes"):
        ck.load_checkpoint(path, max_member_bytes=1_000_000)
    assert "w.npy" not in read
    monkeypatch.setattr(zipfile.ZipFile, "read", real_read)
    arrays, _ = ck.load_checkpoint(path, max_member_bytes=16_000_200)
    assert arrays["w"].shape == (2_000_000,)
    assert ck.MAX_MEMBER_BYTES >= 2 ** 28


def _rewrite(src, dst, change):
    """Copy the checkpoint ``src`` to ``dst`` with ``change(arrays, meta)`` applied (valid CRCs)."""
    arrays, meta = load_checkpoint(src)
    change(arrays, meta)
    meta.pop("format_version")
    save_checkpoint(dst, arrays, meta)
    return dst


def _set(key, value):
    def change(arrays, meta):
        arrays[key] = value(arrays[key]) if callable(value) else value
    return change


def _drop(key):
    return lambda arrays, meta: arrays.pop(key)


@pytest.mark.parametrize("change, words", [
    (_set("collector/episode_return", np.zeros(1)), ["collector/episode_return", "(1,)"]),
    (_set("collector/episode_length", lambda a: a.astype(np.float64)), ["collector/episode_length", "float64"]),
    (_set("collector/episode_starts", np.zeros(7, dtype=bool)), ["collector/episode_starts"]),
    (_set("collector/obs", lambda a: a.astype(np.float32)), ["collector/obs", "float32"]),
    (_set("params/pi.w1", lambda a: a[:-1]), ["params/pi.w1"]),
    (_set("params/pi.w1", lambda a: a.astype(">f8")), ["params/pi.w1"]),
    (_set("adam/m.vf.w0", lambda a: a.T.copy()), ["adam/m.vf.w0"]),
    (_set("adam/t", np.array(1.5)), ["adam/t"]),
    (_drop("adam/v.pi.b0"), ["adam/v.pi.b0", "missing"]),
    (_set("extra/thing", np.zeros(3)), ["extra/thing"]),
    (_set("params/vf.w1", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3, np.nan, a)),
     ["params/vf.w1", "finite"]),
    (_set("params/pi.b0", lambda a: a + np.inf), ["params/pi.b0", "finite"]),
    (_set("adam/v.pi.w0", lambda a: -1.0 - a), ["adam/v.pi.w0", "negative"]),
    (_set("adam/m.pi.w0", lambda a: a * np.nan), ["adam/m.pi.w0", "finite"]),
    (_set("recent_returns", np.zeros((2, 2))), ["recent_returns"]),
    (_set("state_json", lambda a: np.frombuffer(b'{"x": 1}', np.uint8)), ["state_json"]),
])
def test_trainer_load_vets_every_array(small_run, tmp_path, change, words):
    """Shapes, dtypes and values are compared with what the trainer holds: a crafted array of
    another shape, dtype or with non-finite values is refused naming it."""
    path = _rewrite(small_run, tmp_path / "crafted.npz", change)
    with pytest.raises(CheckpointError) as info:
        PPOTrainer.load(path)
    message = str(info.value)
    assert "\n" not in message and "crafted.npz" in message
    for word in words:
        assert word in message


def _state_change(edit):
    def change(arrays, meta):
        from ppo_ref.io.checkpoint import array_to_json, json_to_array
        state = array_to_json(arrays["state_json"])
        edit(state)
        arrays["state_json"] = json_to_array(state)
    return change


@pytest.mark.parametrize("edit", [
    lambda s: s.update(num_timesteps=-5),
    lambda s: s.update(n_updates="3"),
    lambda s: s.update(num_timesteps=s["num_timesteps"] + 1),
    lambda s: s.pop("action_rng"),
    lambda s: s["action_rng"].update(state={"state": "x", "inc": 1}),
    lambda s: s["collector"].update(sub_envs=[{"layers": []}]),
    lambda s: s["collector"]["sub_envs"][0]["layers"][-1]["attrs"].update(brand_new_attr=1),
    lambda s: s["collector"]["sub_envs"][0]["layers"][-1]["attrs"].update(
        state={"__ndarray__": [[1]], "dtype": "object"}),
    lambda s: s["collector"]["sub_envs"][0]["layers"][0]["attrs"].update(step=5),
])
def test_trainer_load_vets_the_state_record(small_run, tmp_path, edit):
    """Counters, generator states and env state from the JSON record: bad ones give
    CheckpointError; env state sets only attributes the env already has (a saved 'step' must
    not shadow the env's method)."""
    path = _rewrite(small_run, tmp_path / "crafted.npz", _state_change(edit))
    with pytest.raises(CheckpointError) as info:
        PPOTrainer.load(path)
    assert "\n" not in str(info.value) and "crafted.npz" in str(info.value)


def test_a_valid_checkpoint_still_loads_exactly(small_run):
    arrays, _ = load_checkpoint(small_run)
    tr = PPOTrainer.load(small_run)
    try:
        again = tr.state_arrays()
    finally:
        tr.close()
    assert set(again) == set(arrays)
    for k in arrays:
        assert again[k].dtype == arrays[k].dtype and again[k].tobytes() == arrays[k].tobytes(), k


# -- loading never imports code without consent -----------------------------------------------------

def _env_module(tmp_path, name):
    """A module ``name`` on sys.path that registers an env and records that it was imported."""
    import sys
    marker = tmp_path / f"{name}.imported"
    (tmp_path / f"{name}.py").write_text(
        "import gymnasium, pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('ran')\n"
        f"gymnasium.register('{name.capitalize()}-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',"
        " max_episode_steps=500)\n")  # CartPole-v1's limit: a checkpoint never changes a limit
    sys.path.insert(0, str(tmp_path))
    return marker


def test_load_does_not_import_the_env_module_without_consent(small_run, tmp_path):
    import sys
    name = "ppo_ref_untrusted_env_mod"
    marker = _env_module(tmp_path, name)
    try:
        path = _rewrite(small_run, tmp_path / "foreign.npz",
                        lambda arrays, meta: meta.update(env_id=f"{name}:{name.capitalize()}-v0"))
        with pytest.raises(CheckpointError) as info:
            PPOTrainer.load(path)
        message = str(info.value)
        assert name in message and "allow_import=True" in message and "\n" not in message
        assert not marker.exists() and name not in sys.modules
        tr = PPOTrainer.load(path, allow_import=True)
        tr.close()
        assert marker.exists()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


@pytest.mark.parametrize("change, words", [
    (_set("collector/state.h", lambda a: a[:, :1]), ["collector/state.h"]),
    (_set("collector/state.c", lambda a: a * np.inf), ["collector/state.c", "finite"]),
    (_set("collector/episode_return", np.zeros(1)), ["collector/episode_return", "(1,)"]),
])
def test_recurrent_trainer_load_vets_every_array(small_lstm_run, tmp_path, change, words):
    from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer
    path = _rewrite(small_lstm_run, tmp_path / "crafted.npz", change)
    with pytest.raises(CheckpointError) as info:
        RecurrentPPOTrainer.load(path)
    for word in words:
        assert word in str(info.value)


def test_a_valid_recurrent_checkpoint_still_loads_exactly(small_lstm_run):
    from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer
    arrays, _ = load_checkpoint(small_lstm_run)
    tr = RecurrentPPOTrainer.load(small_lstm_run)
    try:
        again = tr.state_arrays()
    finally:
        tr.close()
    assert set(again) == set(arrays) and "collector/state.h" in arrays
    for k in arrays:
        assert again[k].dtype == arrays[k].dtype and again[k].tobytes() == arrays[k].tobytes(), k


EARLIER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                       "checkpoints_a09f02a")


@pytest.mark.parametrize("name", ["lstm_cartpolenovel.npz", "pendulum_normalized.npz"])
def test_checkpoints_of_the_earlier_layout_load_and_resume(name):
    """Checkpoints of the layout before the collector carried the LSTM states (tests/data/
    checkpoints_a09f02a/README.md: ``lstm/h``, ``lstm/c``, float32 reward-normalizer entries)
    load into the current trainers with every entry's values, and training continues."""
    from ppo_ref import RecurrentPPOTrainer
    path = os.path.join(EARLIER, name)
    with np.load(path, allow_pickle=False) as f:
        raw = {k: f[k] for k in f.files}
    recurrent = name.startswith("lstm")
    trainer = (RecurrentPPOTrainer if recurrent else PPOTrainer).load(path)
    for key, value in trainer.params.items():
        np.testing.assert_array_equal(value, raw["params/" + key])
    np.testing.assert_array_equal(trainer.collector.obs, raw["collector/obs"])
    if recurrent:
        np.testing.assert_array_equal(trainer.collector.state.h, raw["lstm/h"])
        np.testing.assert_array_equal(trainer.collector.state.c, raw["lstm/c"])
    else:
        rn = trainer.collector.reward_normalizer
        assert raw["collector/ret_accumulated"].dtype == np.float32
        np.testing.assert_array_equal(rn.accumulated_reward, raw["collector/ret_accumulated"])
    steps = trainer.num_timesteps
    trainer.learn(steps + trainer.config.n_steps * trainer.config.n_envs)
    assert trainer.num_timesteps > steps
    assert all(np.isfinite(v).all() for v in trainer.params.values())
    trainer.close()
