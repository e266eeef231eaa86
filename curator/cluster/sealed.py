"""A secret that a stage task carries to the curator's own workers, sealed from the logs.

Dask logs a failed task's arguments at the worker (``Compute Failed ... Task: <Task ...
reblind_slice(b'...', ...)>``, the first 1,000 characters of their repr), and an embedded
cluster's workers write to the curator's own log. The stage functions take their keys and
scalars as :class:`Sealed`, whose repr and str show no byte of them, and open them where they
use them (:func:`opened`). The bytes still travel to the workers (over the cluster's TLS), which
need them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, repr=False, eq=False)
class Sealed:
    """A key or scalar a task carries (its repr and str are ``<sealed secret>``)."""

    value: bytes

    def __repr__(self) -> str:
        return "<sealed secret>"

    __str__ = __repr__


def opened(secret: Sealed | bytes) -> bytes:
    """The bytes of ``secret`` (a :class:`Sealed` or, from an in-process caller, the bytes)."""
    return secret.value if isinstance(secret, Sealed) else bytes(secret)
