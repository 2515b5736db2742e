"""Golden vectors: ppo_ref's numbers as JSON, and a checker for another implementation's outputs.

``write_vectors(out_dir)`` writes one JSON file per case (plus ``index.json``): the inputs, the
settings (including the convention preset and every convention option that matters), and the
outputs ppo_ref computes from exactly those inputs. Another implementation (Rust, JAX, PyTorch,
...) reads each case, runs its own code on ``inputs`` with ``settings``, and writes a results
file; ``check_results(vectors_dir, results_file)`` compares it case by case and returns one row
per case with the largest error. The command line is ``ppo-ref vectors --out DIR`` and
``ppo-ref check DIR --results FILE`` (exit status 1 when a case fails or is missing;
:mod:`ppo_ref.cli.vectors`).

File format (``FORMAT = "ppo_ref.vectors/1"``), one case per file ``<name>.json``::

    {"format": "ppo_ref.vectors/1", "name": "gae_reference", "kind": "gae",
     "function": "ppo_ref.gae", "preset": "reference", "description": "...",
     "inputs":   {"rewards": [[...], ...], "terminated": [[true, false], ...], ...},
     "settings": {"gamma": 0.99, "gae_lambda": 0.95, "truncation": "bootstrap", ...},
     "expected": {"advantages": [[...]], "returns": [[...]]},
     "tolerance": {"atol": 1e-10, "rtol": 1e-9}}

Arrays are time-major ``[T, N, ...]`` as in docs/specification.md §1 and encoded by the rules
of :mod:`ppo_ref.vectors.codec`. The package, in three modules::

    codec.py   encode/decode (NumPy <-> JSON values), dumps, read_json_file and its limits
    cases.py   the cases, ppo_ref's outputs for them (compute_outputs), write_vectors
    check.py   load_cases, check_results (the results format and the pass rule),
               format_table, reference_results, the conventions a failing case would pass under
"""
from ppo_ref.vectors.codec import (DEFAULT_TOLERANCE, FORMAT, MAX_JSON_BYTES, MAX_JSON_DEPTH,
                                   MAX_JSON_INT_DIGITS, RESULTS_FORMAT, decode, dumps, encode,
                                   read_json_file)
from ppo_ref.vectors.cases import (BACKENDS, SEED, apply_preset, compute_outputs,
                                   write_vectors)
from ppo_ref.vectors.check import (TOLERANCE_PROFILES, alternative_conventions, check_results,
                                   encode_decode, format_table, load_case, load_cases,
                                   reference_results)

__all__ = ["FORMAT", "RESULTS_FORMAT", "write_vectors", "load_case", "load_cases",
           "compute_outputs", "reference_results", "check_results", "format_table",
           "encode", "decode", "dumps", "read_json_file", "MAX_JSON_BYTES", "MAX_JSON_DEPTH",
           "MAX_JSON_INT_DIGITS", "DEFAULT_TOLERANCE", "SEED", "BACKENDS", "TOLERANCE_PROFILES",
           "apply_preset", "alternative_conventions", "encode_decode"]
