"""A curator's privacy ledger as a policy: an append-only, hash-chained history (DESIGN 3 and 8).

Releases on the same data set compose: their epsilons add. A data set is a population, keyed by
its name (``dataset``); each release records the SHA-256 of the table file it read (``table``), so a
refreshed or edited table under the same name spends from the same budget. Its budget is set only
by an explicit ``budget`` entry. A release moves through two phases:

- ``reserve`` when the curators agree (refused past the budget, for a reused sampling seed or a
  release id already used differently);
- ``commit`` when the server seals the release, or ``refund`` when it aborts before sealing.

A budget may carry an accounting policy (optional field ``policy`` of the budget entry, absent
from entries without one so their digests are unchanged): ``pld`` fixes a per-release epsilon and
a target delta, and the budget is the number of releases whose optimal composition
(dp_accounting's PLD) stays within (total epsilon, delta) (``accounting.AccountingPolicy``); the
budget entry's epsilon is then that number times the per-release epsilon, and a release with
another epsilon is refused (:class:`PolicyEpsilonError`).

Reserved and committed epsilon both count as spent; a refund gives the reservation back; a
``carry`` entry records spending the server's witness knew beyond a lost history. Every entry is
validated on load (known keys and kind, finite epsilon >= 0, in sequence, transitions that follow)
and carries the digest of its predecessor and its own; a head record (count, last digest and, at
the curator, a signature) is kept beside the entries (:func:`verify_chain`). Plain SHA-256 alone
stops no one who can rewrite the file: the signature and the witness do (docs/privacy.md). This
module is pure: the curator persists the entries (one JSON line each) and the head.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from secure_release.mechanism.errors import (
    BudgetExceededError,
    ErrorKind,
    NonFiniteInputError,
    PolicyEpsilonError,
    SecureReleaseError,
    SeedReuseError,
)
from secure_release.mechanism.privacy.accounting import AccountingPolicy

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


class LostHistoryError(SecureReleaseError):
    """``budget set`` on a ledger whose entries were deleted while its head records some: setting
    a budget now would forget what was spent; the operator must give the server's witness
    (``--server``) or restore the ledger (exit 2: a flag is missing)."""


class LedgerStateError(SecureReleaseError):
    """The entry does not fit the release's state (e.g. a refund after a commit)."""

    kind = ErrorKind.FAILED_PRECONDITION


class EntryKind(enum.Enum):
    """What an entry records."""

    BUDGET = "budget"  # the data set's total budget is now ``epsilon``
    RESERVE = "reserve"  # ``epsilon`` held for ``release_id`` (the curators agreed)
    COMMIT = "commit"  # the server sealed ``release_id``: its reservation is spent for good
    REFUND = "refund"  # ``release_id`` aborted before sealing: its reservation is returned
    CARRY = "carry"  # ``count`` reservations of ``epsilon`` in total that the witness knew (recovery)


#: The keys of a stored entry: required, then optional extensions (omitted at their default, so
#: the digest of an entry written before an extension existed does not change). An unknown key or
#: kind is refused on load: a later version adds a key here (with its check) before writing it.
REQUIRED_KEYS = frozenset(
    {"seq", "kind", "dataset", "name", "release_id", "epsilon", "seed_fingerprint", "time", "prev", "digest"}
)
OPTIONAL_KEYS: dict[str, Any] = {"table": "", "count": 0, "policy": None}
POLICY_KEYS = frozenset({"kind", "total_epsilon", "delta", "per_release_epsilon", "max_releases"})


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a ledger may hold")


@dataclass(frozen=True)
class LedgerEntry:
    """One line of the ledger; ``digest`` chains it to ``prev`` (its predecessor's digest)."""

    seq: int
    kind: EntryKind
    dataset: str  # the data set's name (the budget's key)
    name: str  # the data set's name for people
    release_id: str  # "" for a budget entry
    epsilon: float
    seed_fingerprint: str
    time: float  # seconds since the epoch, when it was written
    prev: str
    digest: str = ""
    table: str = ""  # SHA-256 of the table file a release read ("" for budgets and older entries)
    count: int = 0  # a carry entry: how many reservations it stands for
    policy: dict[str, Any] | None = None  # a budget entry's accounting policy (None: epsilons add)

    def body(self) -> dict[str, Any]:
        """Every field but the digest, JSON-ready (optional extensions only when set)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}  # flat: no deep copy (asdict's)
        data["kind"] = self.kind.value
        del data["digest"]
        for key, default in OPTIONAL_KEYS.items():
            if data[key] == default:
                del data[key]
        return data

    def computed_digest(self) -> str:
        """SHA-256 over the canonical JSON of :meth:`body`."""
        text = json.dumps(self.body(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> str:
        """The entry as one JSON line (no newline)."""
        return json.dumps({**self.body(), "digest": self.digest}, sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, line: str, index: int = 0) -> LedgerEntry:
        """Parse and validate line ``index``; :class:`LedgerTamperedError` naming it if it is not
        an entry: valid JSON without NaN or infinities, exactly the known keys, a known kind, a
        finite epsilon >= 0 (> 0 for budgets and reservations), integer seq and count."""
        try:
            data = json.loads(line, parse_constant=_no_constant)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            unknown = set(data) - REQUIRED_KEYS - set(OPTIONAL_KEYS)
            missing = REQUIRED_KEYS - set(data)
            if unknown or missing:
                raise KeyError(f"unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
            entry = cls(
                seq=_integer(data["seq"], "seq"),
                kind=EntryKind(data["kind"]),
                dataset=str(data["dataset"]),
                name=str(data["name"]),
                release_id=str(data["release_id"]),
                epsilon=_stored_epsilon(data["epsilon"]),
                seed_fingerprint=str(data["seed_fingerprint"]),
                time=_stored_number(data["time"], "time"),
                prev=str(data["prev"]),
                digest=str(data["digest"]),
                table=str(data.get("table", "")),
                count=_integer(data.get("count", 0), "count"),
                policy=_stored_policy(data.get("policy")),
            )
            if entry.policy is not None and entry.kind is not EntryKind.BUDGET:
                raise ValueError(f"a {entry.kind.value} entry carries an accounting policy; only budgets may")
            if entry.kind in (EntryKind.BUDGET, EntryKind.RESERVE) and entry.epsilon <= 0:
                raise ValueError(f"a {entry.kind.value} entry needs epsilon > 0, got {entry.epsilon!r}")
            return entry
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerTamperedError(
                f"ledger entry {index} is not a valid entry ({type(exc).__name__}: {exc}); the history cannot "
                "be trusted: restore it from a backup, or see docs/privacy.md ('When the ledger is refused')"
            ) from exc


def _stored_policy(value: object) -> dict[str, Any] | None:
    """A stored accounting policy, checked for shape (kind ``pld``, finite epsilons > 0, delta in
    (0, 1), a release count >= 1); None if absent. The count is not recomputed here: that needs
    dp_accounting, and a signed head already protects the entry."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != POLICY_KEYS or value["kind"] != "pld":
        raise ValueError(f"policy must be a 'pld' object with keys {sorted(POLICY_KEYS)}, got {value!r}")
    total = _stored_epsilon(value["total_epsilon"])
    per_release = _stored_epsilon(value["per_release_epsilon"])
    delta = _stored_number(value["delta"], "delta")
    releases = _integer(value["max_releases"], "max_releases")
    if min(total, per_release) <= 0 or not 0 < delta < 1 or releases < 1:
        raise ValueError(f"policy values out of range: {value!r}")
    return dict(value)


def _stored_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _stored_epsilon(value: object) -> float:
    epsilon = _stored_number(value, "epsilon")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    return epsilon


def _integer(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class LedgerHead:
    """The head record: how many entries the ledger holds and the digest of the last; with a
    signing key, a signature over both (``signature`` hex, ``key_id`` names the key)."""

    count: int
    digest: str
    signature: str = ""
    key_id: str = ""

    def signed_bytes(self) -> bytes:
        """What a head signature covers: a fixed label, the count and the last digest."""
        return f"secure-release ledger head v1\n{self.count}\n{self.digest}".encode()

    def to_json(self) -> str:
        """The head as JSON."""
        data: dict[str, Any] = {"count": self.count, "digest": self.digest}
        if self.signature:
            data.update(signature=self.signature, key_id=self.key_id)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> LedgerHead:
        """Parse a head record; :class:`LedgerTamperedError` if malformed."""
        try:
            data = json.loads(text, parse_constant=_no_constant)
            count = _integer(data["count"], "count")
            return cls(count, str(data["digest"]), str(data.get("signature", "")), str(data.get("key_id", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerTamperedError(f"the ledger head is malformed ({type(exc).__name__}: {exc})") from exc


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
    check_transitions(entries)
    want = 0 if head is None else head.count
    if len(entries) < want or (head is not None and want > 0 and entries[want - 1].digest != head.digest):
        raise LedgerTamperedError(
            f"the ledger holds {len(entries)} entries but its head record says {want} ending in "
            f"{head.digest[:12] if head else GENESIS[:12]}...: it was truncated or rewritten"
        )


def check_transitions(entries: Sequence[LedgerEntry]) -> None:
    """Every commit or refund settles an open reservation of the same data set and epsilon, and
    every reservation is new; else :class:`LedgerTamperedError` naming the entry."""
    open_: dict[str, LedgerEntry] = {}
    seen: set[str] = set()
    for entry in entries:
        if entry.kind is EntryKind.RESERVE:
            bad = entry.release_id in seen
            seen.add(entry.release_id)
            open_[entry.release_id] = entry
        elif entry.kind in (EntryKind.COMMIT, EntryKind.REFUND):
            held = open_.pop(entry.release_id, None)
            bad = held is None or (held.dataset, held.epsilon) != (entry.dataset, entry.epsilon)
        else:
            bad = entry.kind is EntryKind.CARRY and entry.count < 1
        if bad:
            raise LedgerTamperedError(
                f"ledger entry {entry.seq} ({entry.kind.value} of {entry.release_id or entry.dataset!r}) does not "
                "follow from the entries before it; the history cannot be trusted"
            )


def check_charge(epsilon: float, what: str = "epsilon") -> float:
    """``epsilon`` if it is a finite number > 0; else :class:`NonFiniteInputError`."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not math.isfinite(epsilon) or epsilon <= 0:
        raise NonFiniteInputError(f"{what} must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


@dataclass(frozen=True)
class ReleaseCharge:
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

    def policy(self, dataset: str) -> AccountingPolicy | None:
        """The accounting policy of the data set's budget (its last budget entry), None if that
        budget simply adds epsilons."""
        entries = [e for e in self.entries if e.kind is EntryKind.BUDGET and e.dataset == dataset]
        if not entries or entries[-1].policy is None:
            return None
        p = entries[-1].policy
        return AccountingPolicy(float(p["total_epsilon"]), float(p["delta"]), float(p["per_release_epsilon"]),
                                int(p["max_releases"]))  # fmt: skip

    def release_count(self, dataset: str) -> int:
        """Reserved plus committed releases of the data set (refunds excluded)."""
        return sum(1 for r in self.releases().values() if r.dataset == dataset and r.state is not EntryKind.REFUND)

    def releases(self) -> dict[str, ReleaseCharge]:
        """Every release this ledger knows, by id, in its latest state."""
        out: dict[str, ReleaseCharge] = {}
        for e in self.entries:
            if e.kind is EntryKind.RESERVE:
                out[e.release_id] = ReleaseCharge(e.release_id, e.dataset, e.epsilon, e.seed_fingerprint, e.kind)
            elif e.kind in (EntryKind.COMMIT, EntryKind.REFUND) and e.release_id in out:
                out[e.release_id] = ReleaseCharge(**{**out[e.release_id].__dict__, "state": e.kind})
        return out

    def spent(self, dataset: str) -> float:
        """Reserved plus committed epsilon of the data set (refunds excluded), plus what was
        carried over from the witness after a lost history."""
        held = [r.epsilon for r in self.releases().values() if r.dataset == dataset and r.state is not EntryKind.REFUND]
        return math.fsum(held + [e.epsilon for e in self.carried(dataset)])

    def carried(self, dataset: str) -> list[LedgerEntry]:
        """The data set's carry entries."""
        return [e for e in self.entries if e.kind is EntryKind.CARRY and e.dataset == dataset]

    def witnessed(self, dataset: str) -> tuple[int, float]:
        """(number, total epsilon) of the data set's reservations ever made (refunded ones too)
        plus what was carried over: both only grow, and they are what the server's witness keeps
        (:mod:`secure_release.curator.records.witness`)."""
        held = [e for e in self.entries if e.kind is EntryKind.RESERVE and e.dataset == dataset]
        carried = self.carried(dataset)
        count = len(held) + sum(e.count for e in carried)
        return count, math.fsum([e.epsilon for e in held] + [e.epsilon for e in carried])

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
        self, kind: EntryKind, dataset: str, name: str, release_id: str, epsilon: float, seed: str, now: float,
        table: str = "", count: int = 0, policy: dict[str, Any] | None = None,
    ) -> LedgerEntry:
        prev = self.entries[-1].digest if self.entries else GENESIS
        draft = LedgerEntry(
            len(self.entries), kind, dataset, name, release_id, epsilon, seed, float(now), prev, "", table, count,
            policy,
        )
        return LedgerEntry(**{**draft.__dict__, "digest": draft.computed_digest()})

    def carry(self, dataset: str, name: str, count: int, epsilon: float, now: float) -> LedgerEntry | None:
        """The entry that carries over what the witness knows beyond this ledger (``count``
        reservations, ``epsilon`` in total), counted as spent; None if the ledger is not behind."""
        have_count, have_total = self.witnessed(dataset)
        if count <= have_count and epsilon <= have_total * (1 + BUDGET_SLACK):
            return None
        extra_count, extra = max(count - have_count, 1), max(epsilon - have_total, 0.0)
        return self._entry(EntryKind.CARRY, dataset, name, "", extra, "", now, count=extra_count)

    def set_budget(
        self, dataset: str, name: str, epsilon: float, now: float, table: str = "",
        policy: AccountingPolicy | None = None,
    ) -> LedgerEntry:  # fmt: skip
        """The entry that sets the data set's total budget to ``epsilon`` (finite, > 0);
        ``table``: the fingerprint of the table file it was set from (recorded only). With a
        ``policy`` (``accounting.pld_policy``), ``epsilon`` must be its total epsilon and the entry
        records the policy and its additive budget, max_releases x per-release epsilon."""
        if policy is None:
            return self._entry(EntryKind.BUDGET, dataset, name, "", check_charge(epsilon, "a budget"), "", now,
                               table=table)  # fmt: skip
        if check_charge(epsilon, "a budget") != policy.total_epsilon:
            raise PolicyEpsilonError(f"the budget {epsilon} differs from the policy's total {policy.total_epsilon}")
        other = sorted({r.epsilon for r in self.releases().values() if r.dataset == dataset
                        and r.state is not EntryKind.REFUND and r.epsilon != policy.per_release_epsilon})  # fmt: skip
        if other:  # the PLD count composes releases of one epsilon only
            raise PolicyEpsilonError(
                f"data set {self.name_of(dataset) or dataset[:16]!r} already holds releases of epsilon {other}; "
                f"the PLD policy counts releases of epsilon {policy.per_release_epsilon:g} only"
            )
        return self._entry(EntryKind.BUDGET, dataset, name, "", policy.additive_budget, "", now, table=table,
                           policy=policy.to_dict())  # fmt: skip

    def tables(self, dataset: str) -> list[str]:
        """The fingerprints of the table files recorded for the data set, first seen first."""
        return list(dict.fromkeys(e.table for e in self.entries if e.dataset == dataset and e.table))

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
        policy = self.policy(dataset)
        if policy is not None:
            if epsilon != policy.per_release_epsilon:
                raise PolicyEpsilonError(
                    f"data set {self.name_of(dataset) or dataset[:16]!r} is budgeted for releases of epsilon "
                    f"{policy.per_release_epsilon:g} each (PLD policy, delta {policy.delta:g}); this release has "
                    f"{epsilon:g}"
                )
            used = self.release_count(dataset)
            if used + 1 > policy.max_releases:
                raise BudgetExceededError(
                    f"data set {self.name_of(dataset) or dataset[:16]!r}: {used} of its {policy.max_releases} releases "
                    f"(epsilon {policy.per_release_epsilon:g} each, PLD within ({policy.total_epsilon:g}, "
                    f"{policy.delta:g})) are spent or reserved"
                )
        spent = self.spent(dataset)
        if spent + epsilon > budget * (1 + BUDGET_SLACK):
            raise BudgetExceededError(
                f"data set {self.name_of(dataset) or dataset[:16]!r}: spent or reserved {spent:.6g} + this release "
                f"{epsilon:.6g} exceeds the budget {budget:.6g}; at most {max(budget - spent, 0):.6g} remains"
            )
        return True

    @staticmethod
    def _check_known(known: ReleaseCharge, dataset: str, epsilon: float, seed: str | None) -> bool:
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
        self, dataset: str, name: str, release_id: str, epsilon: float, seed_fingerprint: str, now: float,
        table: str = "",
    ) -> LedgerEntry | None:
        """The reserve entry, None if this exact reservation is already held; raises if refused.
        ``table``: the SHA-256 of the table file this release reads (recorded, not a key)."""
        if not self.check_reserve(dataset, release_id, epsilon, seed_fingerprint):
            return None
        return self._entry(
            EntryKind.RESERVE, dataset, name, release_id, float(epsilon), seed_fingerprint, now, table=table
        )

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
        entries = [LedgerEntry.from_json(line, i) for i, line in enumerate(x for x in lines if x.strip())]
        verify_chain(entries, head)
        return cls(entries)
