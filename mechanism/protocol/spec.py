"""One release, as every role sees it: :class:`ReleaseSpec` (id, curators, cipher, granted
researchers and the plan), the name grammar, and the validators the server and the curators
share. ``infra.wire`` turns it into ``securerelease.v1.ReleaseParams`` and back; nothing else does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from secure_release.mechanism.errors import (
    DuplicateNameError,
    ErrorKind,
    InvalidNameError,
    SecureReleaseError,
    ShapeMismatchError,
    TooFewCuratorsError,
)
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, symbol_width
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.primitives.pram import check_gamma
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.privacy.plan import ReleasePlan
from secure_release.mechanism.protocol.tables import TableLayout, TablesPlan, check_layouts, segments_of
from secure_release.mechanism.schema import check_joint_alphabet

#: Release ids: a letter or digit, then up to 127 letters, digits, '.', '_', '-'.
NAME_GRAMMAR = "[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
#: Party names (curators, researchers, the server, analysts) are DNS labels, because every
#: certificate carries its holder's name as a DNS name that clients pin (infra/tls.py).
PARTY_GRAMMAR = "[a-z0-9][a-z0-9-]{0,62}"
#: At most this many curators or granted researchers in one release, curators in one stored
#: table (every status reply lists them; a party list is a bound, not a payload).
MAX_PARTIES = 16
#: The default operator cap on one release's epsilon (server and curator ``--max-epsilon``):
#: e^20 is about 4.9e8, a likelihood ratio far past any meaningful protection.
DEFAULT_MAX_EPSILON = 20.0
_NAME_RE = re.compile(NAME_GRAMMAR)
_PARTY_RE = re.compile(PARTY_GRAMMAR)


def check_name(name: str, what: str = "name") -> str:
    """``name`` if it follows :data:`NAME_GRAMMAR` exactly (no trailing newline, no '/', no '..'
    path tricks); otherwise :class:`InvalidNameError`."""
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise InvalidNameError(f"{what} {name!r} must match {NAME_GRAMMAR}")
    return name


def check_party_name(name: str, what: str = "party name") -> str:
    """``name`` if it is a lowercase DNS label (:data:`PARTY_GRAMMAR`), else InvalidNameError."""
    if not isinstance(name, str) or _PARTY_RE.fullmatch(name) is None:
        raise InvalidNameError(f"{what} {name!r} must match {PARTY_GRAMMAR} (a lowercase DNS label)")
    return name


class TooManyPartiesError(SecureReleaseError):
    """More curators or researchers than one release or stored table may name."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


def check_names(names: Sequence[str], what: str, minimum: int = 0) -> tuple[str, ...]:
    """Distinct party names, each a DNS label, at least ``minimum`` and at most
    :data:`MAX_PARTIES` of them (counted before any is parsed)."""
    if len(names) > MAX_PARTIES:
        raise TooManyPartiesError(f"at most {MAX_PARTIES} {what}s may be named, got {len(names)} {what}s")
    out = tuple(check_party_name(n, what) for n in names)
    if len(set(out)) != len(out):
        raise DuplicateNameError(f"{what}s must be distinct, got {list(out)}")
    if len(out) < minimum:
        raise TooFewCuratorsError(f"need at least {minimum} {what}s, got {list(out)}")
    return out


def check_plan(plan: ReleasePlan) -> ReleasePlan:
    """A plan received from elsewhere: 1 <= m <= n, epsilon finite > 0, a valid joint alphabet
    whose symbols fit the wire, and a gamma whose exact epsilon (Eq. 1) does not exceed the
    declared one (compared in exact arithmetic: a gamma above Eq. 2's value by any amount fails)."""
    check_sample_size(plan.n, plan.m)
    accounting.check_epsilon(plan.epsilon)
    check_joint_alphabet(plan.alphabet_sizes)
    for k in plan.alphabet_sizes:
        symbol_width(k)
    check_gamma(plan.gamma)
    accounting.check_declared_gamma(plan.n, plan.m, plan.epsilon, plan.gamma)  # exact, never above
    return plan


@dataclass(frozen=True)
class ReleaseSpec:
    """Everything the parties must agree on for one release (public: the server holds it)."""

    release_id: str
    curators: tuple[str, ...]  # joint-code order
    cipher: CipherMode
    plan: ReleasePlan
    researchers: tuple[str, ...] = ()  # granted researchers (certificate names)
    table_id: str = ""  # server-sampled release: the stored table the server samples
    #: a release of several tables (``protocol/tables.py``): each table's m_t, gamma_t and the
    #: curators' alphabets in it; empty for the one whole joint table (the plan's m and gamma)
    tables: tuple[TableLayout, ...] = ()
    design_digest: str = ""  # the design every curator runs with (SHA-256 hex), with ``tables``

    @property
    def designed(self) -> bool:
        """True for a release of the tables of a design (``tables``), not the whole joint."""
        return bool(self.tables)

    def segments_of(self, curator: str) -> tuple[tuple[int, int], ...] | None:
        """The (m_t, k_t) of ``curator``'s pad in a designed release, None for the whole joint."""
        return segments_of(self.tables, self.curators.index(curator)) if self.tables else None

    @property
    def server_sampled(self) -> bool:
        """True if the server draws the sample from stored table :attr:`table_id`."""
        return bool(self.table_id)

    def validate(self) -> ReleaseSpec:
        """Raise a named error unless every field is well formed and consistent."""
        check_name(self.release_id, "release id")
        check_names(self.curators, "curator", minimum=2)
        check_names(self.researchers, "researcher")
        if self.table_id:
            check_name(self.table_id, "table id")
        if not isinstance(self.cipher, CipherMode):
            raise SecureReleaseError(f"cipher must be a CipherMode, got {self.cipher!r}")
        if len(self.plan.alphabet_sizes) != len(self.curators):
            raise ShapeMismatchError(
                f"{len(self.plan.alphabet_sizes)} alphabet sizes for {len(self.curators)} curators"
            )
        if not self.tables:
            check_plan(self.plan)
            return self
        if self.table_id:
            raise ShapeMismatchError("a release of several tables is sampled by the curators, not from a stored table")
        if not re.fullmatch("[0-9a-f]{64}", self.design_digest):
            raise ShapeMismatchError(
                f"a designed release needs its design's SHA-256 (64 hex digits), got {self.design_digest!r}"
            )
        check_sample_size(self.plan.n, self.plan.m)
        accounting.check_epsilon(self.plan.epsilon)
        check_joint_alphabet(self.plan.alphabet_sizes)
        for k in self.plan.alphabet_sizes:
            symbol_width(k)
        check_layouts(self.plan.n, self.plan.alphabet_sizes, self.plan.epsilon, self.tables)
        if sum(t.m for t in self.tables) != self.plan.m:
            total = sum(t.m for t in self.tables)
            raise ShapeMismatchError(f"the tables' m_t sum to {total}, not the release's m = {self.plan.m}")
        return self

    # ------------------------------------------------------------------ derived
    @property
    def n(self) -> int:
        return self.plan.n

    @property
    def m(self) -> int:
        return self.plan.m

    @property
    def num_chunks(self) -> int:
        """Upload chunks of CHUNK_ROWS symbols: derived from m, never trusted from a client."""
        return -(-self.plan.m // CHUNK_ROWS)

    def rows_in_chunk(self, seq: int) -> int:
        return min(CHUNK_ROWS, self.plan.m - seq * CHUNK_ROWS)

    def alphabet_of(self, curator: str) -> int:
        return self.plan.alphabet_sizes[self.curators.index(curator)]

    def differences(self, other: ReleaseSpec) -> list[str]:
        """The fields (other than granted researchers) in which ``other`` differs, readable."""
        mine, theirs = self.to_dict(), other.to_dict()
        keys = [*mine, *(k for k in theirs if k not in mine)]
        return [
            f"{k} ({theirs.get(k)!r} != {mine.get(k)!r})"
            for k in keys
            if k != "researchers" and mine.get(k) != theirs.get(k)
        ]

    # ------------------------------------------------------------------ JSON (stores, files)
    def to_dict(self) -> dict[str, Any]:
        return {
            "release_id": self.release_id,
            "curators": list(self.curators),
            "cipher": self.cipher.value,
            "researchers": list(self.researchers),
            **self.plan.to_dict(),
            **({"table_id": self.table_id} if self.table_id else {}),  # curator-sampled: as before
            **({"tables": [t.to_dict() for t in self.tables], "design_digest": self.design_digest}
               if self.tables else {}),  # the whole joint: as before
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReleaseSpec:
        plan = ReleasePlan(
            n=int(d["n"]),
            m=int(d["m"]),
            alphabet_sizes=tuple(int(k) for k in d["alphabet_sizes"]),
            epsilon=float(d["epsilon"]),
            gamma=float(d["gamma"]),
        )
        return cls(
            release_id=str(d["release_id"]),
            curators=tuple(str(c) for c in d["curators"]),
            cipher=CipherMode.parse(str(d["cipher"])),
            plan=plan,
            researchers=tuple(str(r) for r in d.get("researchers", ())),
            table_id=str(d.get("table_id", "")),
            tables=tuple(TableLayout.from_dict(t) for t in d.get("tables", ())),
            design_digest=str(d.get("design_digest", "")),
        )


def designed_spec(
    release_id: str,
    curators: Sequence[str],
    cipher: CipherMode,
    n: int,
    plan: TablesPlan,
    researchers: Sequence[str] = (),
) -> ReleaseSpec:
    """The validated spec of a release of a design's tables (``protocol/tables.py``) for ``n``
    aligned records: the layouts for this n, m = sum m_t, every curator's whole-schema alphabet
    (the wire's packing), the design's epsilon (what every ledger charges) and its digest."""
    layouts = plan.layouts(n, curators)
    sizes = tuple(plan.schema_of(c).alphabet_size for c in curators)
    whole = ReleasePlan(n, sum(x.m for x in layouts), sizes, plan.epsilon, max(x.gamma for x in layouts))
    return ReleaseSpec(release_id, tuple(curators), cipher, whole, tuple(researchers), tables=layouts,
                       design_digest=plan.digest).validate()  # fmt: skip
