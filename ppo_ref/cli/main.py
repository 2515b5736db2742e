"""The ``ppo-ref`` parser and entry point: every subcommand in :data:`SUBCOMMANDS` (each a
``configure(parser)`` and a ``run(args) -> int`` of its own module of ``ppo_ref.cli``)."""
from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional

from ppo_ref._checks import one_line
from ppo_ref._numba import announce_compiling
from ppo_ref.cli.common import FULL_ERRNOS, UsageError
from ppo_ref.cli.details import cmd_details, configure_details
from ppo_ref.cli.diff import cmd_diff, configure_diff
from ppo_ref.cli.eval import cmd_eval, configure_eval
from ppo_ref.cli.plot import cmd_plot, configure_plot
from ppo_ref.cli.train import cmd_train, configure_train
from ppo_ref.cli.vectors import cmd_check, cmd_vectors, configure_check, configure_vectors
from ppo_ref.config import IneffectiveSettingWarning

__all__ = ["SUBCOMMANDS", "register_subcommand", "build_parser", "main"]

#: subcommand name -> ``(help, configure(subparser), run(args) -> int)``
SUBCOMMANDS: Dict[str, Any] = {}


def register_subcommand(name: str, help: str,
                        configure: Callable[[argparse.ArgumentParser], None],
                        run: Callable[[argparse.Namespace], int]) -> None:
    """Add a subcommand: ``configure`` adds its arguments, ``run(args)`` returns the exit code."""
    SUBCOMMANDS[name] = (help, configure, run)


register_subcommand("train", "train a policy (default: CartPole-v1, zoo settings, 100k steps)",
                    configure_train, cmd_train)
register_subcommand("eval", "evaluate a run's checkpoint", configure_eval, cmd_eval)
register_subcommand("plot", "write DIR/learning_curve.png (a --seeds directory: "
                    "learning_curves.png)", configure_plot, cmd_plot)
register_subcommand("vectors", "write golden JSON test vectors (ppo_ref.vectors)",
                    configure_vectors, cmd_vectors)
register_subcommand("check", "check another implementation's outputs against golden vectors",
                    configure_check, cmd_check)
register_subcommand("diff", "name the first quantity where two PPO update traces part "
                    "(ppo_ref.testing.trace)", configure_diff, cmd_diff)
register_subcommand("details", "print the PPO implementation details table (ppo_ref.details)",
                    configure_details, cmd_details)


class _OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line, ``<prog>: error: <message> (see <prog> --help)``
    (exit status 2; subcommand parsers are of this class too)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from ppo_ref import __version__
    parser = _OneLineParser(prog="ppo-ref", description="ppo_ref: PPO in NumPy + numba")
    parser.add_argument("--version", action="version", version=f"ppo-ref {__version__}")
    # (kept on the parser: its choices map each name to its parser, for :func:`_parse`)
    parser.subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, configure, _) in SUBCOMMANDS.items():
        configure(parser.subcommands.add_parser(name, help=help_text, description=help_text))
    return parser


def _parse(argv: List[str]) -> argparse.Namespace:
    """``argv`` parsed; an argument no parser knows is the subcommand's error (``ppo-ref
    train: error: unrecognized arguments: ...``), not the top-level parser's."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.subcommands.choices[args.command].error(
            f"unrecognized arguments: {' '.join(unknown)}")
    return args


class _ReaderGone:
    """A stdout or stderr whose reader may go away (``ppo-ref train | head``): the first write
    or flush that fails (``OSError``, or ``ValueError`` for a closed stream) ends its printing,
    never the command, and points the descriptor at ``/dev/null`` (so the interpreter's last
    flush does not complain). A failure other than a gone reader (a full disk: ``ENOSPC``) is
    kept in ``lost`` for :func:`main` to report."""

    def __init__(self, stream, fd: Optional[int]):
        self._stream = stream
        self._fd = fd
        self.gone = stream is None  # Python's stand-in for a descriptor closed at start-up
        self.lost: Optional[OSError] = None

    def _lost(self) -> None:
        self.gone = True
        if self._fd is not None:
            with contextlib.suppress(OSError):
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, self._fd)
                os.close(null)

    def _call(self, method: str, *args):
        if not self.gone:
            try:
                return getattr(self._stream, method)(*args)
            except (OSError, ValueError) as exc:
                if isinstance(exc, OSError) and exc.errno not in (errno.EPIPE, None):
                    self.lost = exc
                self._lost()
        return None

    def write(self, text):
        written = self._call("write", text)
        return len(text) if written is None else written

    def flush(self):
        self._call("flush")

    def isatty(self) -> bool:
        return not self.gone and bool(getattr(self._stream, "isatty", lambda: False)())

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _guarded_streams():
    """``sys.stdout`` and ``sys.stderr`` as :class:`_ReaderGone` for the block (restored after)."""
    saved = sys.stdout, sys.stderr
    fds = {id(sys.__stdout__): 1, id(sys.__stderr__): 2}
    sys.stdout = _ReaderGone(saved[0], fds.get(id(saved[0])))
    sys.stderr = _ReaderGone(saved[1], fds.get(id(saved[1])))
    try:
        yield sys.stdout
    finally:
        for guard in (sys.stdout, sys.stderr):
            guard.flush()
        sys.stdout, sys.stderr = saved


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``ppo-ref`` and ``python -m ppo_ref``; returns the exit code.

    No subcommand means ``train``. One line ``ppo-ref <command>: error: <message>`` reports a
    :class:`UsageError` (exit status 2) and a full disk (``ENOSPC``, ``EDQUOT``, ``EFBIG``:
    exit status 1); Ctrl-C outside the training loop is one line and exit status 130; other
    exceptions are bugs and keep their traceback. Output goes through :class:`_ReaderGone`;
    output lost to a failing stdout other than a gone reader (a full disk) is one line on stderr
    and exit status 1.
    """
    with _guarded_streams() as stdout:
        code = _main(argv)
    if stdout.lost is not None:
        print(f"ppo-ref: error: cannot write the output: {stdout.lost.strerror or stdout.lost}",
              file=sys.stderr)
        code = code or 1
    if argv is None:
        # the program ends here: leave its objects to the process's end instead of one last
        # collection over all of them (halves the exit, e.g. after a second Ctrl-C)
        import gc
        gc.freeze()
    return code


@contextlib.contextmanager
def _one_line_warnings(command: str):
    """An :class:`~ppo_ref.config.IneffectiveSettingWarning` as one line ``ppo-ref <command>:
    warning: <message>``, each message once (a config is copied several times); others as
    Python shows them."""
    shown = set()
    show = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, IneffectiveSettingWarning):
            return show(message, category, filename, lineno, file, line)
        text = one_line(message)
        if text not in shown:
            shown.add(text)
            print(f"ppo-ref {command}: warning: {text}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("always", IneffectiveSettingWarning)
        warnings.showwarning = showwarning
        yield


def _main(argv: Optional[List[str]]) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["train"] + argv
    args = _parse(argv)
    args.argv = argv  # the command line as given (recorded in config.json)
    _, _, run = SUBCOMMANDS[args.command]
    if sys.stderr.isatty():  # on a terminal: one line once numba has compiled for a second
        announce_compiling()
    try:
        with _one_line_warnings(args.command):
            return int(run(args))
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (it has its own handler)
        print(f"\nppo-ref {args.command}: interrupted", file=sys.stderr)
        return 130
    except UsageError as exc:
        print(f"ppo-ref {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in FULL_ERRNOS:
            raise
        where = f" writing {exc.filename}:" if exc.filename else ""
        print(f"ppo-ref {args.command}: error:{where} {exc.strerror or exc} (free some space "
              f"and run the command again)", file=sys.stderr)
        return 1
