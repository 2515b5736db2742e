"""Golden vectors: ppo_ref's numbers as JSON, and a checker for another implementation's outputs.

``write_vectors(out_dir)`` writes one JSON file per case and ``index.json``; another
implementation runs its code on each case's ``inputs`` with its ``settings`` and writes a results
file (:mod:`ppo_ref.vectors.check`), which ``check_results(vectors_dir, results_file)`` compares
case by case (command line: ``ppo-ref vectors --out DIR``, ``ppo-ref check DIR --results FILE``).
A case file (``FORMAT = "ppo_ref.vectors/1"``, arrays time-major as in docs/specification.md §1,
encoded by :mod:`ppo_ref.vectors.codec`)::

    {"format": "ppo_ref.vectors/1", "name": "gae_reference", "kind": "gae",
     "function": "ppo_ref.gae", "preset": "reference", "description": "...",
     "inputs":   {"rewards": [[...], ...], "terminated": [[true, false], ...], ...},
     "settings": {"gamma": 0.99, "gae_lambda": 0.95, "truncation": "bootstrap", ...},
     "expected": {"advantages": [[...]], "returns": [[...]]},
     "tolerance": {"atol": 1e-10, "rtol": 1e-9}}
"""
from ppo_ref.vectors.codec import (DEFAULT_TOLERANCE, FORMAT, MAX_JSON_BYTES, MAX_JSON_DEPTH,
                                   MAX_JSON_INT_DIGITS, RESULTS_FORMAT, decode, dumps, encode,
                                   read_json_file)
from ppo_ref.vectors.cases import BACKENDS, SEED, apply_preset, compute_outputs, write_vectors
from ppo_ref.vectors.check import (TOLERANCE_PROFILES, alternative_conventions, check_results,
                                   encode_decode, format_table, load_case, load_cases,
                                   reference_results)

__all__ = ["FORMAT", "RESULTS_FORMAT", "write_vectors", "load_case", "load_cases",
           "compute_outputs", "reference_results", "check_results", "format_table",
           "encode", "decode", "dumps", "read_json_file", "MAX_JSON_BYTES", "MAX_JSON_DEPTH",
           "MAX_JSON_INT_DIGITS", "DEFAULT_TOLERANCE", "SEED", "BACKENDS", "TOLERANCE_PROFILES",
           "apply_preset", "alternative_conventions", "encode_decode"]
