"""``secure-release``: one console script, one module per subcommand.

Each subcommand lives in its own module under ``secure_release.commands`` (folder
``app/commands/``) and is listed in that package's static ``REGISTRY``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from secure_release.commands import REGISTRY
from secure_release.examples import own_data_text
from secure_release.infra import exitcodes as exits
from secure_release.infra.entry import run_main


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("secure-release")
    except metadata.PackageNotFoundError:
        from secure_release import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The ``secure-release`` parser with every subcommand registered."""
    parser = _Parser(
        prog="secure-release",
        description=(
            "Differentially private release of a vertically partitioned table: curators sample "
            "the same m of n aligned records, encrypt them with additive pads, an untrusted server "
            "applies gamma-diagonal PRAM to the ciphertext, and a researcher decrypts and "
            "estimates the joint distribution."
        ),
        epilog=(
            "Run 'secure-release COMMAND --help' for each command's options.\n\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage (bad flags, settings or input), 3 refused "
            "(budget, permission, a key refused), 130 interrupted.\n\n"
            "Release your own two tables (docs/own-data.md):\n" + own_data_text()
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"secure-release {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for register in REGISTRY.values():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; its exit code follows the convention in
    :mod:`secure_release.infra.exitcodes` (0 ok, 1 runtime failure, 2 usage, 3 refused,
    130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return exits.USAGE
    return run_main(f"secure-release {args.command}", lambda: int(args.func(args)))


if __name__ == "__main__":
    raise SystemExit(main())
