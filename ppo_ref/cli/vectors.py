"""``ppo-ref vectors --out DIR`` and ``ppo-ref check DIR --results FILE``: the command line of
:mod:`ppo_ref.vectors` (write golden vectors; check another implementation's results)."""
from __future__ import annotations

import json
import os
import re
import sys

from ppo_ref.cli.common import UsageError, user_input
from ppo_ref.config import PRESETS
from ppo_ref.vectors import check_results, format_table, read_json_file, write_vectors
from ppo_ref.vectors.cases import BACKENDS, SEED
from ppo_ref.vectors.check import TOLERANCE_PROFILES, nothing_compared

__all__ = ["configure_vectors", "cmd_vectors", "configure_check", "cmd_check"]

#: The parameters of :func:`ppo_ref.vectors.check_results` as ``ppo-ref check`` spells them.
_FLAGS = {"results_file": "--results", "atol": "--atol", "rtol": "--rtol",
          "tolerances": "--tolerances", "skip_outputs": "--skip-output"}


def configure_vectors(p) -> None:
    """Arguments of ``ppo-ref vectors`` on an argparse parser."""
    p.description = ("Write golden vectors (inputs, settings, expected outputs, convention "
                     "preset) as JSON, one file per case, plus index.json. Format: "
                     "validation/README.md.")
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--seed", type=int, default=SEED, help="seed of the generated inputs")
    p.add_argument("--backend", default="spec", choices=BACKENDS,
                   help="the tier computing the expected outputs: spec (readable, default: "
                        "nothing to compile) or fast (compiled); they agree within tolerance")
    p.add_argument("--preset", default=None,
                   help="compute every convention-dependent case under this PPOConfig preset's "
                        "conventions: " + ", ".join(PRESETS))
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="replace a setting in every case that has it (value as JSON, e.g. "
                        "gamma=0.9, dual_clip=2.0); repeatable")


def cmd_vectors(args) -> int:
    """``ppo-ref vectors --out DIR``: write the cases (:func:`ppo_ref.vectors.write_vectors`);
    print one line per case. :class:`UsageError` for a bad flag or a directory that cannot be
    written."""
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if args.preset is not None and args.preset not in PRESETS:
        raise UsageError(f"--preset must be one of {', '.join(PRESETS)}, got {args.preset!r}")
    settings = {}
    for item in args.set or []:
        key, sep, text = item.partition("=")
        if not sep:
            raise UsageError(f"--set expects key=value, got {item!r}")
        try:
            settings[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            settings[key.strip()] = text
    with user_input(f"cannot write {args.out}"):  # (a full disk: exit 1, as for every command)
        try:
            names = write_vectors(args.out, seed=args.seed, backend=args.backend,
                                  preset=args.preset, settings=settings)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    print(f"wrote {len(names)} cases to {args.out} (index.json + one <name>.json per case)")
    for name in names:
        print(f"  {name}")
    return 0


def configure_check(p) -> None:
    """Arguments of ``ppo-ref check`` on an argparse parser."""
    p.description = ("Compare a results JSON (format ppo_ref.results/1) with golden vectors; "
                     "prints a pass/fail table with the largest error per case; exit status 1 "
                     "when a case fails or is missing, or when no output was compared.")
    p.add_argument("vectors_dir", help="directory written by `ppo-ref vectors`")
    p.add_argument("--results", required=True, help="results JSON of the implementation")
    p.add_argument("--atol", type=float, default=None, help="override every case's atol")
    p.add_argument("--rtol", type=float, default=None, help="override every case's rtol")
    p.add_argument("--allow-missing", action="store_true",
                   help="report cases absent from the results as SKIP instead of failing")
    p.add_argument("--profile", default="float64", choices=tuple(TOLERANCE_PROFILES),
                   help="float32: raise every tolerance to atol=rtol=1e-4 (an implementation "
                        "computing in float32)")
    p.add_argument("--tolerances", default=None, metavar="FILE",
                   help="JSON of per-case / per-output tolerance overrides: {\"case\": "
                        "{\"atol\": ..}, \"case/output\": {..}, \"*/output\": {..}}")
    p.add_argument("--skip-output", action="append", metavar="NAME",
                   help="an output the implementation does not produce (e.g. clip_fraction, "
                        "or case/output); repeatable")


def cmd_check(args) -> int:
    """``ppo-ref check DIR --results FILE``: print the table of
    :func:`ppo_ref.vectors.check_results`; 1 if a case fails or is missing, or if nothing was
    compared (every case skipped); :class:`UsageError` when the vectors or the results file
    cannot be read."""
    if not os.path.isdir(args.vectors_dir):
        what = "is a file" if os.path.exists(args.vectors_dir) else "does not exist"
        raise UsageError(f"vectors directory {args.vectors_dir} {what} (write one with "
                         "`ppo-ref vectors --out DIR`)")
    try:
        tolerances = (read_json_file(args.tolerances, "--tolerances file") if args.tolerances
                      else None)
        rows = check_results(args.vectors_dir, args.results, atol=args.atol, rtol=args.rtol,
                             allow_missing=args.allow_missing, profile=args.profile,
                             tolerances=tolerances, skip_outputs=args.skip_output or ())
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename or args.results}: "
                         f"{exc.strerror or exc}") from None
    except ValueError as exc:  # a message naming a parameter of check_results names its flag
        raise UsageError(re.sub(rf"^({'|'.join(_FLAGS)})\b", lambda m: _FLAGS[m[1]],
                                str(exc))) from None
    print(format_table(rows))
    if nothing_compared(rows):
        print("ppo-ref check: nothing was compared (every case skipped, missing or unknown): "
              "not a pass", file=sys.stderr)
        return 1
    return 1 if any(r["status"] in ("FAIL", "MISSING", "UNKNOWN") for r in rows) else 0
