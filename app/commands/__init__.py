"""The subcommands of ``secure-release``: one module per subcommand, one static registry.

Each module exposes ``register(subparsers) -> None``; the parser it adds sets
``func(args) -> int``. A new subcommand is a new module here plus one line in
:data:`REGISTRY` (CONTRIBUTING.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from secure_release.commands import analyst, demo, keygen, pki, plan, reproduce, schema, simulate

#: Every subcommand in the order ``secure-release --help`` lists them.
REGISTRY: dict[str, Callable[[Any], None]] = {
    "plan": plan.register,
    "demo": demo.register,
    "simulate": simulate.register,
    "reproduce": reproduce.register,
    "pki": pki.register,
    "schema": schema.register,
    "keygen": keygen.register,
    "analyst": analyst.register,
}
