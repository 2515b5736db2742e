"""``ppo-ref details``: the PPO implementation-details table of :mod:`ppo_ref.details` in a
terminal layout or as markdown."""
from __future__ import annotations

import sys

from ppo_ref.details import GROUPS, MARKDOWN_PATH, markdown, terminal_table

__all__ = ["configure_details", "cmd_details"]


def configure_details(parser) -> None:
    """Arguments of ``ppo-ref details``."""
    parser.add_argument("--markdown", action="store_true",
                        help=f"print the markdown table (the text of {MARKDOWN_PATH})")
    parser.add_argument("--group", choices=sorted(GROUPS), default=None,
                        help="only the details of one group")


def cmd_details(args) -> int:
    """``ppo-ref details``: print the table (terminal layout, or markdown with --markdown)."""
    text = markdown() if args.markdown else terminal_table()
    if args.group is not None:
        if args.markdown:
            keep = [line for line in text.splitlines()
                    if not line.startswith("| ") or line.startswith("| key ")
                    or line.startswith(f"| {args.group}-")]
        else:
            keep, inside = [], False
            for line in text.splitlines():
                if line.startswith("== "):
                    inside = line.startswith(f"== {args.group} ")
                if inside:
                    keep.append(line)
        text = "\n".join(keep) + "\n"
    sys.stdout.write(text)
    return 0
