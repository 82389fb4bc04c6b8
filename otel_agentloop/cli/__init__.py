"""``otel-agentloop``: run the simulated agent loop (``simulate``) or rebuild a step from stored traces (``report``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._args import Parser
from ._report_args import add_report_parser
from ._simulate import add_simulate_parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="otel-agentloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    add_report_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
