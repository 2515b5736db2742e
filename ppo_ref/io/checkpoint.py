"""Checkpoint files: named NumPy arrays plus a JSON metadata record, in one ``.npz``.

Format version 1: an uncompressed ``.npz`` (a zip of ``.npy`` members), one member per array
of the trainer state (float64 stored bit-exactly) and the member ``__metadata__``, a ``uint8``
array of UTF-8 JSON. Nothing is pickled and every member is vetted before it is parsed
(:func:`arrays_from_bytes`), so loading runs no code and a damaged or crafted file is one
:class:`CheckpointError` line. Writes are atomic (:func:`write_atomic`). Whether the arrays fit
a trainer is checked by ``PPOTrainer.load`` with the ``vet_*`` functions here.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import stat
import struct
import sys
import tempfile
import threading
import tokenize
import zipfile
import zlib
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from ppo_ref._checks import one_line, one_line_repr

FORMAT_VERSION = 1
METADATA_KEY = "__metadata__"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty archive

__all__ = [
    "CheckpointError", "FORMAT_VERSION", "MAX_MEMBER_BYTES", "check_env_import",
    "arrays_to_bytes", "arrays_from_bytes", "write_atomic", "remove_stale_temporaries",
    "TEMPORARY_PREFIX", "vet_state_arrays", "vet_state_record", "vet_env_value",
    "vet_checkpoint_metadata", "RECENT_EPISODES", "save_checkpoint", "load_checkpoint",
    "json_to_array", "array_to_json", "generator_state", "generator_from_state",
    "set_generator_state", "to_jsonable", "from_jsonable",
]


class CheckpointError(ValueError):
    """A checkpoint file (or byte string) is missing, corrupt, truncated or of the wrong format."""


def _check_arrays(arrays: Mapping[str, np.ndarray], name: str = "arrays"
                  ) -> Dict[str, np.ndarray]:
    if not isinstance(arrays, Mapping):
        raise ValueError(f"{name} must be a mapping from str to ndarray, got "
                         f"{type(arrays).__name__}")
    out = {}
    for key, value in arrays.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{name} keys must be non-empty strings, got {key!r}")
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise ValueError(f"{name}[{key!r}] has dtype object; only plain numeric/bool/str "
                             "arrays are stored (no pickling)")
        out[key] = arr
    return out


def arrays_to_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Uncompressed ``.npz`` bytes of ``arrays`` (``str -> ndarray`` of numeric, bool or
    fixed-width string dtype; ``ValueError`` otherwise), bit-identical through
    :func:`arrays_from_bytes`."""
    buf = io.BytesIO()
    np.savez(buf, **_check_arrays(arrays))
    return buf.getvalue()


# np.lib.format parses headers with ast.literal_eval, not thread-safe on CPython 3.11/3.12
# (gh-106905; thread actors decode broadcasts concurrently): one lock serializes the decoding
_NPZ_LOCK = threading.Lock()

#: The largest member (bytes) a load reads unless told otherwise: far above any trainer state,
#: small enough that a crafted archive cannot make a load allocate gigabytes.
MAX_MEMBER_BYTES = 2 ** 30

# Dtype kinds a member may hold: bool, integers, floats, complex, fixed-width bytes and text.
_MEMBER_KINDS = "biufcSU"

# what a damaged or crafted archive can make zipfile, the .npy header parser or numpy raise
_DECODE_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError,
                  KeyError, IndexError, TypeError, NotImplementedError, RuntimeError,
                  RecursionError, MemoryError, OverflowError, SyntaxError, tokenize.TokenError,
                  UnicodeDecodeError, struct.error, zlib.error)


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, source: str,
                 max_member_bytes: int) -> np.ndarray:
    """One member, vetted as :func:`arrays_from_bytes` says."""
    name = info.filename
    if info.compress_type != zipfile.ZIP_STORED:
        raise CheckpointError(f"{source}: member {name!r} is compressed (method "
                              f"{info.compress_type}); ppo_ref writes members stored, uncompressed")
    if info.file_size != info.compress_size:
        raise CheckpointError(f"{source}: member {name!r} is stored but its header gives "
                              f"{info.file_size} bytes uncompressed, {info.compress_size} stored")
    if info.file_size > max_member_bytes:
        raise CheckpointError(f"{source}: member {name!r} holds {info.file_size} bytes, more than "
                              f"the limit of {max_member_bytes} bytes per member")
    payload = zf.read(name)  # raises BadZipFile on a CRC-32 mismatch
    if len(payload) != info.file_size:
        raise CheckpointError(f"{source}: member {name!r} has {len(payload)} bytes, its header "
                              f"says {info.file_size}")
    stream = io.BytesIO(payload)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise CheckpointError(f"{source}: member {name!r} has .npy format version {version}")
    if dtype.kind not in _MEMBER_KINDS or dtype.hasobject or dtype.fields is not None \
            or dtype.subdtype is not None:
        raise CheckpointError(f"{source}: member {name!r} has dtype {dtype}; ppo_ref stores plain "
                              "bool, numeric and fixed-width string arrays only")
    count = math.prod(int(n) for n in shape)
    body = len(payload) - stream.tell()
    if count * dtype.itemsize != body:
        raise CheckpointError(f"{source}: member {name!r} header says shape {shape} of {dtype} "
                              f"({count * dtype.itemsize} bytes) but holds {body} data bytes")
    flat = np.frombuffer(payload, dtype=dtype, count=count, offset=stream.tell())
    return flat.reshape(shape, order="F" if fortran_order else "C").copy(order="K")


def arrays_from_bytes(data: bytes, *, source: str = "<bytes>",
                      max_member_bytes: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Inverse of :func:`arrays_to_bytes`; never unpickles. Each member is vetted before it is
    parsed: stored uncompressed, at most ``max_member_bytes`` (default
    :data:`MAX_MEMBER_BYTES`, from its zip header, so an oversized member is never read), its
    CRC-32 verified, its ``.npy`` header a plain dtype describing exactly the bytes that follow;
    names unique and ending in ``.npy``. Raises :class:`CheckpointError` naming ``source``."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"data must be bytes, got {type(data).__name__}")
    return _read_archive(io.BytesIO(bytes(data)), source, max_member_bytes)


def _read_archive(fh, source: str, max_member_bytes: Optional[int]) -> Dict[str, np.ndarray]:
    """The members of the archive in the binary file ``fh``, vetted as :func:`arrays_from_bytes`
    says (``OSError``: ``fh`` cannot be read)."""
    cap = MAX_MEMBER_BYTES if max_member_bytes is None else int(max_member_bytes)
    magic = fh.read(4)
    if not magic:
        raise CheckpointError(f"{source} is empty (truncated)")
    if magic not in _ZIP_MAGIC:
        raise CheckpointError(f"{source} is not a ppo_ref checkpoint (not an .npz archive: "
                              "corrupt or a foreign file)")
    fh.seek(0)
    try:
        with _NPZ_LOCK, zipfile.ZipFile(fh) as zf:
            infos = zf.infolist()
            names = [info.filename for info in infos]
            if len(set(names)) != len(names):
                raise CheckpointError(f"{source}: the archive lists a member twice (crafted or "
                                      "corrupt)")
            out = {}
            for info in infos:
                if not info.filename.endswith(".npy"):
                    raise CheckpointError(f"{source} is not a ppo_ref checkpoint (member "
                                          f"{info.filename!r} is not a .npy array)")
                out[info.filename[:-len(".npy")]] = _read_member(zf, info, source, cap)
            return out
    except CheckpointError:
        raise
    except _DECODE_ERRORS as exc:
        raise CheckpointError(f"{source} is not a valid checkpoint archive (corrupt or truncated): "
                              f"{type(exc).__name__}: {one_line(exc, 300)}") from None


def json_to_array(obj: Any) -> np.ndarray:
    """Encode a JSON-serializable object as a ``uint8`` array (UTF-8 JSON text)."""
    text = json.dumps(obj, sort_keys=True, allow_nan=True)
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def array_to_json(arr: np.ndarray, *, name: str = "metadata") -> Any:
    """Decode :func:`json_to_array` output; raises :class:`CheckpointError` on bad content."""
    a = np.asarray(arr)
    if a.dtype != np.uint8 or a.ndim != 1:
        raise CheckpointError(f"{name} must be a 1-d uint8 array of JSON text, got {a.dtype} "
                              f"{a.shape}")
    try:
        return json.loads(a.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError, MemoryError) as exc:
        # ValueError covers JSONDecodeError and integers beyond Python's digit limit;
        # RecursionError: nesting deeper than the parser's stack
        raise CheckpointError(f"{name} is not valid JSON: {type(exc).__name__}: "
                              f"{one_line(exc, 200)}") from None


def save_checkpoint(path, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> str:
    """Atomically write ``arrays`` and JSON ``metadata`` (plus ``format_version``) to the
    ``.npz`` file ``path``; returns ``path``. ``ValueError`` for bad arrays, non-JSON metadata,
    or a ``path`` that is not a regular file."""
    checked = _check_arrays(arrays)
    if METADATA_KEY in checked:
        raise ValueError(f"arrays must not contain the reserved key {METADATA_KEY!r}")
    if not isinstance(metadata, Mapping):
        raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        checked[METADATA_KEY] = json_to_array({**metadata, "format_version": FORMAT_VERSION})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serializable: {exc}") from None
    return write_atomic(path, arrays_to_bytes(checked))


#: Names of the temporary files :func:`write_atomic` writes beside ``<name>``:
#: ``<TEMPORARY_PREFIX><name>-<random>``.
TEMPORARY_PREFIX = ".tmp-"


def _umask() -> int:
    """The file creation mask (from ``/proc/self/status``; elsewhere set and restored)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path, data: bytes) -> str:
    """Replace (or create) the file ``path`` with ``data`` so that a crash at any instant leaves
    the old file or the new one, whole: write ``<dir>/.tmp-<name>-<random>`` (same file system),
    ``fsync``, give it the replaced file's mode (new: ``0o666`` minus the umask),
    ``os.replace``, ``fsync`` the directory. A failure removes the temporary file and re-raises
    (a kill -9 may leave it: :func:`remove_stale_temporaries`). Returns ``path``. Raises
    ``ValueError`` when ``path`` exists and is not a regular file (a symlink is replaced, its
    target untouched), ``OSError`` when the directory cannot be written."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"data must be bytes, got {type(data).__name__}")
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(f"{path!r} exists and is not a regular file (a directory, device, FIFO "
                         "or socket): refusing to replace it")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMPORARY_PREFIX + os.path.basename(path) + "-",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself durable (not on every platform)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def remove_stale_temporaries(directory, names) -> list:
    """Remove the temporary files (``.tmp-<name>-*``) a killed :func:`write_atomic` left in
    ``directory`` for the files ``names``; only while no other process writes them (a run
    directory: under its lock). Returns the names removed."""
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    prefixes = tuple(f"{TEMPORARY_PREFIX}{name}-" for name in names)
    for entry in entries:
        if entry.startswith(prefixes):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))
                removed.append(entry)
    return removed


def load_checkpoint(path, *, max_member_bytes: Optional[int] = None
                    ) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """``(arrays, metadata)`` of a file written by :func:`save_checkpoint`, vetted as
    :func:`arrays_from_bytes`. Raises :class:`CheckpointError` (one line naming the file) when
    it is missing, not a complete archive, without the metadata member, or of another format
    version."""
    path = os.fspath(path)
    source = f"checkpoint {path!r}"
    if not os.path.isfile(path):
        if os.path.lexists(path):
            raise CheckpointError(f"checkpoint {path!r} is not a regular file (a FIFO, device, "
                                  "directory or dangling symlink)")
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    try:
        with open(path, "rb") as fh:
            arrays = _read_archive(fh, source, max_member_bytes)
    except OSError as exc:
        raise CheckpointError(f"cannot read {source}: {exc.strerror or exc}") from None
    if METADATA_KEY not in arrays:
        raise CheckpointError(f"checkpoint {path!r} is not a ppo_ref checkpoint (an .npz archive "
                              f"without the {METADATA_KEY!r} member: a foreign file)")
    metadata = array_to_json(arrays.pop(METADATA_KEY), name=f"checkpoint {path!r} metadata")
    if not isinstance(metadata, dict):
        raise CheckpointError(f"checkpoint {path!r} metadata must be a JSON object")
    version = metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format_version {version!r}; "
                              f"this ppo_ref reads version {FORMAT_VERSION}")
    return arrays, metadata


def check_env_import(env_id, allow_import: bool, source: str) -> None:
    """Refuse (``CheckpointError``) an ``env_id`` ``"module:EnvId"`` whose module is not imported
    yet, unless ``allow_import``: a checkpoint is data and runs no code without consent."""
    if not isinstance(env_id, str) or ":" not in env_id:
        return
    module = env_id.rpartition(":")[0]
    if module and module not in sys.modules and not allow_import:
        raise CheckpointError(f"{source} names env {env_id!r}, which would import (run) the Python "
                              f"module {module!r}; loading a checkpoint imports no code without "
                              "consent: pass allow_import=True (ppo-ref: --allow-import) if you "
                              "trust it")


#: How many finished-episode returns a trainer remembers (and saves): ``recent_returns``.
RECENT_EPISODES = 100
# arrays only required free of NaN (a return may overflow to +-inf); other floats: finite
_NAN_FREE_ONLY = frozenset({"collector/episode_return", "recent_returns"})
# arrays of variances (>= 0) and sample counts (> 0) of the state
_NON_NEGATIVE = ("adam/v.", "collector/obs_rms.var", "collector/ret_rms.var",
                 "collector/episode_length")
_POSITIVE = ("collector/obs_rms.count", "collector/ret_rms.count")
_MAX_COUNT = 2 ** 53


def vet_state_arrays(expected: Mapping[str, np.ndarray], arrays: Mapping[str, np.ndarray]) -> None:
    """Raise ``ValueError`` naming the entry unless ``arrays`` can be the trainer state whose
    fresh counterpart is ``expected``: the same names, dtypes and shapes (``recent_returns``:
    1-d float64 of at most :data:`RECENT_EPISODES`; ``state_json``: 1-d uint8); floats finite
    (episode accumulators and ``recent_returns``: free of NaN); variances, second moments and
    lengths >= 0; sample counts > 0."""
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing:
        raise ValueError(f"entries {missing} are missing")
    if extra:
        raise ValueError(f"entries {extra} are not part of this trainer's state")
    for key, want in expected.items():
        got = np.asarray(arrays[key])
        if key == "recent_returns":
            ok = got.dtype == np.float64 and got.ndim == 1 and got.shape[0] <= RECENT_EPISODES
            want_text = f"float64 (n,) with n <= {RECENT_EPISODES}"
        elif key == "state_json":
            ok = got.dtype == np.uint8 and got.ndim == 1
            want_text = "uint8 (n,)"
        else:
            ok = got.dtype == want.dtype and got.shape == want.shape
            want_text = f"{want.dtype} {want.shape}"
        if not ok:
            raise ValueError(f"entry {key!r} is {got.dtype} {got.shape}, expected {want_text}")
        if got.dtype.kind == "f":
            bad = np.isnan(got) if key in _NAN_FREE_ONLY else ~np.isfinite(got)
            if bad.any():
                raise ValueError(f"entry {key!r} holds {int(bad.sum())} non-finite value(s)")
        if key.startswith(_NON_NEGATIVE) and (got < 0).any():
            raise ValueError(f"entry {key!r} holds negative values (a variance, second moment "
                             "or length is >= 0)")
        if key.startswith(_POSITIVE) and not (got > 0).all():
            raise ValueError(f"entry {key!r} must be > 0 (a sample count)")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT


def _count(record: Mapping[str, Any], key: str, where: str = "state_json") -> int:
    value = record.get(key)
    if not _is_count(value):
        raise ValueError(f"{where}[{key!r}] must be an integer in [0, 2**53], got "
                         f"{one_line_repr(value, 60)}")
    return value


def vet_state_record(state: Any, *, n_steps: int, n_envs: int, n_recent: int,
                     episode_lengths=None) -> Dict[str, int]:
    """The counters ``{num_timesteps, n_updates, n_episodes, total_timesteps}`` of a trainer's
    ``state_json`` record, vetted: integers in ``[0, 2**53]`` that agree as training makes them
    (``num_timesteps`` a multiple of ``n_steps * n_envs``, ``n_updates`` at most the rollouts
    held, ``n_episodes <= num_timesteps``, ``n_recent <= n_episodes``, the collector's
    ``vector_steps`` 0 or ``num_timesteps / n_envs``, no running episode longer than the vector
    steps), ``progress_remaining`` in [0, 1]. Raises ``ValueError`` naming the counter."""
    if not isinstance(state, Mapping) or not isinstance(state.get("collector"), Mapping):
        raise ValueError("state_json is not a trainer state record")
    counters = {key: _count(state, key) for key in
                ("num_timesteps", "n_updates", "n_episodes", "total_timesteps")}
    steps, updates = counters["num_timesteps"], counters["n_updates"]
    batch = int(n_steps) * int(n_envs)
    if steps % batch:
        raise ValueError(f"state_json num_timesteps ({steps}) is not a whole number of rollouts "
                         f"of n_steps * n_envs = {batch} steps")
    if updates > steps // batch:
        raise ValueError(f"state_json n_updates ({updates}) is more than the {steps // batch} "
                         f"rollouts its num_timesteps ({steps}) hold: an update needs a rollout")
    if counters["n_episodes"] > steps:
        raise ValueError(f"state_json n_episodes ({counters['n_episodes']}) is more than its "
                         f"num_timesteps ({steps}): an episode lasts at least one step")
    if n_recent > counters["n_episodes"]:
        raise ValueError(f"state_json holds {n_recent} recent returns but n_episodes is "
                         f"{counters['n_episodes']}")
    vector_steps = _count(state["collector"], "vector_steps", "state_json['collector']")
    if vector_steps not in (0, steps // int(n_envs)):
        raise ValueError(f"state_json num_timesteps ({steps}) and the collector's vector_steps "
                         f"({vector_steps}) disagree (expected {steps // int(n_envs)} vector "
                         f"steps of {n_envs} envs)")
    if episode_lengths is not None and vector_steps and np.any(np.asarray(episode_lengths) >
                                                              vector_steps):
        raise ValueError(f"state_json has an episode running for more steps than the "
                         f"{vector_steps} vector steps taken")
    progress = state.get("progress_remaining")
    if isinstance(progress, bool) or not isinstance(progress, (int, float)) \
            or not 0.0 <= progress <= 1.0:
        raise ValueError(f"state_json['progress_remaining'] must be a number in [0, 1], "
                         f"got {one_line_repr(progress, 60)}")
    return counters


# env attributes that are settings, not state: a restored value must equal the env's own
_ENV_SETTINGS = frozenset({"_max_episode_steps", "max_episode_steps"})


def vet_env_value(layer: str, name: str, saved: Any, current: Any, limit: Any = None) -> None:
    """Raise ``ValueError`` naming ``layer.name`` unless ``saved`` (decoded from a checkpoint)
    may replace the env's ``current`` value: a limit (``_max_episode_steps``) must equal the
    env's own, ``_elapsed_steps`` be an integer in ``[0, limit]``; other attributes are the
    env's business."""
    where = f"saved env state {layer}.{name} = {one_line_repr(saved, 60)}"
    if name in _ENV_SETTINGS:
        if type(saved) is not type(current) or saved != current:
            raise ValueError(f"{where} differs from this env's own "
                             f"{one_line_repr(current, 60)} (a limit of the env, not state)")
    elif name == "_elapsed_steps" and limit is not None:
        if isinstance(saved, (bool, np.bool_)) or not isinstance(saved, (int, np.integer)) \
                or not 0 <= saved <= limit:
            raise ValueError(f"{where} must be an integer in [0, {limit}] (the env's "
                             f"_max_episode_steps)")


def vet_checkpoint_metadata(meta: Mapping[str, Any], source: str = "checkpoint") -> None:
    """Raise :class:`CheckpointError` naming ``source`` and the key unless a checkpoint's
    metadata has the types a trainer writes (checked before anything is built from it):
    ``trainer`` a non-empty string; ``env_id`` None or a printable id of at most 256
    characters; ``config`` an object, ``env_kwargs`` None or one; ``seed`` an integer >= 0; the
    counters integers in [0, 2**53]; ``vectorization`` "sync", "async" or "envpool"."""
    def bad(key, want):
        raise CheckpointError(f"{source}: metadata {key} must be {want}, got "
                              f"{one_line_repr(meta.get(key), 60)}")
    trainer = meta.get("trainer")
    if not isinstance(trainer, str) or not trainer:
        bad("trainer", "the name of a trainer class")
    env_id = meta.get("env_id")
    if env_id is not None and (not isinstance(env_id, str) or not env_id or len(env_id) > 256
                               or not env_id.isprintable()):
        bad("env_id", "a gymnasium id (a non-empty printable string of at most 256 characters)")
    if not isinstance(meta.get("config"), Mapping):
        bad("config", "a JSON object (the PPOConfig)")
    seed = meta.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        bad("seed", "an integer >= 0")
    for key in ("num_timesteps", "n_updates", "n_episodes", "total_timesteps"):
        if not _is_count(meta.get(key)):
            bad(key, "an integer in [0, 2**53]")
    if meta.get("vectorization", "sync") not in ("sync", "async", "envpool"):
        bad("vectorization", "'sync', 'async' or 'envpool'")
    if meta.get("env_kwargs") is not None and not isinstance(meta.get("env_kwargs"), Mapping):
        bad("env_kwargs", "a JSON object")


def generator_state(rng: np.random.Generator) -> Dict[str, Any]:
    """The JSON-safe state of a ``np.random.Generator`` (its ``bit_generator.state`` dict)."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    return to_jsonable(rng.bit_generator.state)


def to_jsonable(obj):
    """``obj`` with NumPy arrays and scalars as JSON values (inverse: :func:`from_jsonable`)."""
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    return obj


def from_jsonable(obj):
    """Inverse of :func:`to_jsonable`."""
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
        return {k: from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_jsonable(v) for v in obj]
    return obj


def set_generator_state(rng: np.random.Generator, state: Mapping[str, Any]) -> None:
    """Restore a state from :func:`generator_state` into ``rng`` (same bit generator type)."""
    want = state.get("bit_generator") if isinstance(state, Mapping) else None
    have = type(rng.bit_generator).__name__
    if want != have:
        raise CheckpointError(f"generator state is for bit generator {want!r}, not {have!r}")
    rng.bit_generator.state = from_jsonable(dict(state))


def generator_from_state(state: Mapping[str, Any]) -> np.random.Generator:
    """A new ``np.random.Generator`` positioned at ``state`` (from :func:`generator_state`)."""
    name = state.get("bit_generator") if isinstance(state, Mapping) else None
    bit_cls = getattr(np.random, str(name), None)
    if not (isinstance(bit_cls, type) and issubclass(bit_cls, np.random.BitGenerator)):
        raise CheckpointError(f"unknown bit generator {name!r} in generator state")
    rng = np.random.Generator(bit_cls())
    set_generator_state(rng, state)
    return rng
