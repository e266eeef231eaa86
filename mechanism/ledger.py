"""A curator's privacy ledger as a policy: an append-only, hash-chained history (DESIGN 3 and 8).

Releases on the same data set compose: their epsilons add. A data set is identified by the
SHA-256 fingerprint of its table file (``dataset``) and carries a name for people. Its budget is
set only by an explicit ``budget`` entry. A release moves through two phases:

- ``reserve`` when the curators agree (refused past the budget, for a reused sampling seed or a
  release id already used differently);
- ``commit`` when the server seals the release, or ``refund`` when it aborts before sealing.

Reserved and committed epsilon both count as spent; a refund gives the reservation back. Every
entry carries the digest of its predecessor and its own digest, and a head record (count and
last digest) is kept beside the entries, so a truncated or edited history is detected
(:func:`verify_chain`). This module is pure: the curator persists the entries (one JSON line
each) and the head.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from secure_release.mechanism.errors import (
    BudgetExceededError,
    ErrorKind,
    NonFiniteInputError,
    SecureReleaseError,
    SeedReuseError,
)

GENESIS = "0" * 64
#: Relative slack when comparing sums of epsilons to a budget (float rounding only).
BUDGET_SLACK = 1e-12


class LedgerTamperedError(SecureReleaseError):
    """The stored ledger does not verify: an entry was edited, removed or reordered, or the
    history is shorter than its head record says."""

    kind = ErrorKind.FAILED_PRECONDITION


class NoBudgetError(SecureReleaseError):
    """No budget was set for this data set (or its ledger was deleted): the release is refused
    (exit 3), as one past the budget is."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


class LedgerStateError(SecureReleaseError):
    """The entry does not fit the release's state (e.g. a refund after a commit)."""

    kind = ErrorKind.FAILED_PRECONDITION


class EntryKind(enum.Enum):
    """What an entry records."""

    BUDGET = "budget"  # the data set's total budget is now ``epsilon``
    RESERVE = "reserve"  # ``epsilon`` held for ``release_id`` (the curators agreed)
    COMMIT = "commit"  # the server sealed ``release_id``: its reservation is spent for good
    REFUND = "refund"  # ``release_id`` aborted before sealing: its reservation is returned


@dataclass(frozen=True)
class LedgerEntry:
    """One line of the ledger; ``digest`` chains it to ``prev`` (its predecessor's digest)."""

    seq: int
    kind: EntryKind
    dataset: str  # SHA-256 fingerprint (hex) of the table file
    name: str  # the data set's name for people
    release_id: str  # "" for a budget entry
    epsilon: float
    seed_fingerprint: str
    time: float  # seconds since the epoch, when it was written
    prev: str
    digest: str = ""

    def body(self) -> dict[str, Any]:
        """Every field but the digest, JSON-ready."""
        data = asdict(self)
        data["kind"] = self.kind.value
        del data["digest"]
        return data

    def computed_digest(self) -> str:
        """SHA-256 over the canonical JSON of :meth:`body`."""
        text = json.dumps(self.body(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> str:
        """The entry as one JSON line (no newline)."""
        return json.dumps({**self.body(), "digest": self.digest}, sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> LedgerEntry:
        """Parse one line; :class:`LedgerTamperedError` if it is not an entry."""
        try:
            data = json.loads(line)
            return cls(
                seq=int(data["seq"]),
                kind=EntryKind(data["kind"]),
                dataset=str(data["dataset"]),
                name=str(data["name"]),
                release_id=str(data["release_id"]),
                epsilon=float(data["epsilon"]),
                seed_fingerprint=str(data["seed_fingerprint"]),
                time=float(data["time"]),
                prev=str(data["prev"]),
                digest=str(data["digest"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerTamperedError(f"a ledger line is not an entry ({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class LedgerHead:
    """The head record: how many entries the ledger holds and the digest of the last."""

    count: int
    digest: str

    def to_json(self) -> str:
        """The head as JSON."""
        return json.dumps({"count": self.count, "digest": self.digest})

    @classmethod
    def from_json(cls, text: str) -> LedgerHead:
        """Parse a head record; :class:`LedgerTamperedError` if malformed."""
        try:
            data = json.loads(text)
            return cls(int(data["count"]), str(data["digest"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerTamperedError(f"the ledger head is malformed ({type(exc).__name__})") from exc


def verify_chain(entries: Sequence[LedgerEntry], head: LedgerHead | None) -> None:
    """Raise :class:`LedgerTamperedError` unless ``entries`` form an unbroken chain from
    :data:`GENESIS` and reach at least as far as ``head`` (``None``: an empty ledger). Entries
    past the head are allowed: a crash between appending an entry and updating the head."""
    prev = GENESIS
    for index, entry in enumerate(entries):
        if entry.seq != index or entry.prev != prev or entry.computed_digest() != entry.digest:
            raise LedgerTamperedError(
                f"ledger entry {index} does not verify (edited, removed or reordered); the history "
                "cannot be trusted: restore it from a backup, or move it away and set the budget again"
            )
        prev = entry.digest
    want = 0 if head is None else head.count
    if len(entries) < want or (head is not None and want > 0 and entries[want - 1].digest != head.digest):
        raise LedgerTamperedError(
            f"the ledger holds {len(entries)} entries but its head record says {want} ending in "
            f"{head.digest[:12] if head else GENESIS[:12]}...: it was truncated or rewritten"
        )


def check_charge(epsilon: float, what: str = "epsilon") -> float:
    """``epsilon`` if it is a finite number > 0; else :class:`NonFiniteInputError`."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not math.isfinite(epsilon) or epsilon <= 0:
        raise NonFiniteInputError(f"{what} must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


@dataclass(frozen=True)
class ReleaseRecord:
    """Where one release stands in a ledger."""

    release_id: str
    dataset: str
    epsilon: float
    seed_fingerprint: str
    state: EntryKind  # RESERVE, COMMIT or REFUND


@dataclass
class PrivacyLedger:
    """The verified history of one keystore, and the decisions that extend it."""

    entries: list[LedgerEntry] = field(default_factory=list)

    # ------------------------------------------------------------ queries
    def budget(self, dataset: str) -> float | None:
        """The data set's budget (its last budget entry), or None if none was set."""
        values = [e.epsilon for e in self.entries if e.kind is EntryKind.BUDGET and e.dataset == dataset]
        return values[-1] if values else None

    def releases(self) -> dict[str, ReleaseRecord]:
        """Every release this ledger knows, by id, in its latest state."""
        out: dict[str, ReleaseRecord] = {}
        for e in self.entries:
            if e.kind is EntryKind.RESERVE:
                out[e.release_id] = ReleaseRecord(e.release_id, e.dataset, e.epsilon, e.seed_fingerprint, e.kind)
            elif e.kind is not EntryKind.BUDGET and e.release_id in out:
                out[e.release_id] = ReleaseRecord(**{**out[e.release_id].__dict__, "state": e.kind})
        return out

    def spent(self, dataset: str) -> float:
        """Reserved plus committed epsilon of the data set (refunds excluded)."""
        return math.fsum(
            r.epsilon for r in self.releases().values() if r.dataset == dataset and r.state is not EntryKind.REFUND
        )

    def remaining(self, dataset: str) -> float | None:
        """Budget minus spent (None if no budget is set)."""
        budget = self.budget(dataset)
        return None if budget is None else budget - self.spent(dataset)

    def name_of(self, dataset: str) -> str:
        """The latest name given to the data set ("" if unknown)."""
        names = [e.name for e in self.entries if e.dataset == dataset and e.name]
        return names[-1] if names else ""

    # ------------------------------------------------------------ decisions
    def _entry(
        self, kind: EntryKind, dataset: str, name: str, release_id: str, epsilon: float, seed: str, now: float
    ) -> LedgerEntry:
        prev = self.entries[-1].digest if self.entries else GENESIS
        draft = LedgerEntry(len(self.entries), kind, dataset, name, release_id, epsilon, seed, float(now), prev)
        return LedgerEntry(**{**draft.__dict__, "digest": draft.computed_digest()})

    def set_budget(self, dataset: str, name: str, epsilon: float, now: float) -> LedgerEntry:
        """The entry that sets the data set's total budget to ``epsilon`` (finite, > 0)."""
        return self._entry(EntryKind.BUDGET, dataset, name, "", check_charge(epsilon, "a budget"), "", now)

    def check_reserve(self, dataset: str, release_id: str, epsilon: float, seed_fingerprint: str | None) -> bool:
        """Raise if this reservation would be refused; False if it is already held (a resume),
        True if it is new. ``seed_fingerprint`` None: the seed is not known yet."""
        epsilon = check_charge(epsilon)
        known = self.releases().get(release_id)
        if known is not None:
            return self._check_known(known, dataset, epsilon, seed_fingerprint)
        if seed_fingerprint is not None and any(
            r.seed_fingerprint == seed_fingerprint for r in self.releases().values()
        ):
            raise SeedReuseError(f"sampling seed {seed_fingerprint} was already used; every release needs a fresh seed")
        budget = self.budget(dataset)
        if budget is None:
            raise NoBudgetError(
                f"no budget is set for data set {dataset[:16]}...; set one with "
                "'secure-release-curator budget set --keystore K --data FILE --epsilon E'"
            )
        spent = self.spent(dataset)
        if spent + epsilon > budget * (1 + BUDGET_SLACK):
            raise BudgetExceededError(
                f"data set {self.name_of(dataset) or dataset[:16]!r}: spent or reserved {spent:.6g} + this release "
                f"{epsilon:.6g} exceeds the budget {budget:.6g}; at most {max(budget - spent, 0):.6g} remains"
            )
        return True

    @staticmethod
    def _check_known(known: ReleaseRecord, dataset: str, epsilon: float, seed: str | None) -> bool:
        same = known.dataset == dataset and known.epsilon == epsilon and seed in (None, known.seed_fingerprint)
        if not same:
            raise SeedReuseError(
                f"release {known.release_id!r} is already in this ledger with another data set, epsilon or "
                "seed; every release needs a fresh id"
            )
        if known.state is EntryKind.REFUND:
            raise LedgerStateError(
                f"release {known.release_id!r} was aborted and refunded; a new release needs a fresh id"
            )
        return False

    def reserve(
        self, dataset: str, name: str, release_id: str, epsilon: float, seed_fingerprint: str, now: float
    ) -> LedgerEntry | None:
        """The reserve entry, None if this exact reservation is already held; raises if refused."""
        if not self.check_reserve(dataset, release_id, epsilon, seed_fingerprint):
            return None
        return self._entry(EntryKind.RESERVE, dataset, name, release_id, float(epsilon), seed_fingerprint, now)

    def _settle(self, kind: EntryKind, release_id: str, now: float) -> LedgerEntry | None:
        known = self.releases().get(release_id)
        if known is None:
            raise LedgerStateError(f"release {release_id!r} has no reservation in this ledger")
        if known.state is kind:
            return None
        if known.state is not EntryKind.RESERVE:
            raise LedgerStateError(
                f"release {release_id!r} is already {known.state.value}ed; it cannot be {kind.value}ed too"
            )
        return self._entry(kind, known.dataset, "", release_id, known.epsilon, known.seed_fingerprint, now)

    def commit(self, release_id: str, now: float) -> LedgerEntry | None:
        """The commit entry of a sealed release (None if already committed)."""
        return self._settle(EntryKind.COMMIT, release_id, now)

    def refund(self, release_id: str, now: float) -> LedgerEntry | None:
        """The refund entry of a release aborted before sealing (None if already refunded)."""
        return self._settle(EntryKind.REFUND, release_id, now)

    def append(self, entry: LedgerEntry) -> None:
        """Add ``entry`` (it must extend the chain)."""
        prev = self.entries[-1].digest if self.entries else GENESIS
        if entry.seq != len(self.entries) or entry.prev != prev or entry.computed_digest() != entry.digest:
            raise LedgerTamperedError(f"entry {entry.seq} does not extend this ledger's chain")
        self.entries.append(entry)

    def head(self) -> LedgerHead:
        """The head record of the current history."""
        return LedgerHead(len(self.entries), self.entries[-1].digest if self.entries else GENESIS)

    @classmethod
    def from_lines(cls, lines: Iterable[str], head: LedgerHead | None) -> PrivacyLedger:
        """A verified ledger from its JSON lines and head record."""
        entries = [LedgerEntry.from_json(line) for line in lines if line.strip()]
        verify_chain(entries, head)
        return cls(entries)
