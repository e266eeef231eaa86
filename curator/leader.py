"""What the leading curator collects for one release: every curator's tags and alphabet size,
guarded by one condition variable (the RPC threads add, the run thread waits). The agreement
itself is :func:`secure_release.mechanism.protocol.leader_agree`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from secure_release.curator.errors import AgreementError, AgreementFixedError, AlphabetSizeMismatchError
from secure_release.curator.keystore import tags_digest
from secure_release.mechanism.alignment import TagArray
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.keys import Seed
from secure_release.mechanism.pads import CipherMode
from secure_release.mechanism.protocol import Agreement, leader_agree


@dataclass
class LeaderState:
    """One release at the leader.

    Every curator's alphabet size comes with its tags (``TagChunk.alphabet_size``; the leader
    adds its own). ``expected_sizes`` (the optional ``--alphabet-sizes``) only cross-checks them:
    a curator whose size differs fails the whole agreement with an
    :class:`AlphabetSizeMismatchError`.
    """

    release_id: str
    curators: tuple[str, ...]  # joint-code order, leader included
    expected_sizes: tuple[int, ...] | None
    epsilon: float
    m: int | None
    cipher: CipherMode
    researchers: tuple[str, ...]
    seed: Seed | None = None  # injected for tests; else fresh per release
    tags: dict[str, TagArray] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    agreement: Agreement | None = None
    published: bool = False  # followers are served the agreement only once the leader registered it
    digests: dict[str, str] = field(default_factory=dict)  # tag digests of a restored agreement
    told: set[str] = field(default_factory=set)  # followers already sent the failure
    error: str | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        if self.expected_sizes is not None and len(self.expected_sizes) != len(self.curators):
            raise AlphabetSizeMismatchError(
                f"--alphabet-sizes has {len(self.expected_sizes)} entries for {len(self.curators)} curators"
            )

    def _checked_size(self, curator: str, alphabet_size: int) -> int:
        expected = None if self.expected_sizes is None else self.expected_sizes[self.curators.index(curator)]
        if alphabet_size == 0:  # a curator that does not send its size
            if expected is None:
                raise AlphabetSizeMismatchError(
                    f"curator {curator!r} sent no alphabet size with its tags; upgrade it or "
                    "give the leader --alphabet-sizes"
                )
            return expected
        if expected is not None and alphabet_size != expected:
            raise AlphabetSizeMismatchError(
                f"release {self.release_id!r}: curator {curator!r} has alphabet size "
                f"{alphabet_size}, but --alphabet-sizes at the leader says {expected}"
            )
        return alphabet_size

    def _is_resubmission(self, curator: str, tags: TagArray, size: int) -> bool:
        if curator in self.tags:
            return np.array_equal(self.tags[curator], tags) and self.sizes.get(curator) == size
        if self.agreement is None or curator not in self.digests:
            return False
        return self.digests[curator] == tags_digest(tags) and self.agreement.spec.alphabet_of(curator) == size

    def restore(self, agreement: Agreement, digests: dict[str, str]) -> None:
        """Take back the agreement a previous run of this leader fixed and persisted (not yet
        published: the leader registers it first)."""
        with self.cond:
            self.agreement, self.digests = agreement, dict(digests)

    def tag_digests(self) -> dict[str, str]:
        """Every curator's tag digest (what :meth:`restore` needs after a restart)."""
        with self.cond:
            return {c: tags_digest(t) for c, t in self.tags.items()} or dict(self.digests)

    def lacks_tags_of(self, curator: str) -> bool:
        """True while no agreement is fixed and ``curator``'s tags never arrived here (e.g. this
        leader restarted after the follower sent them): the follower must send them again."""
        with self.cond:
            return self.agreement is None and curator not in self.tags

    def publish(self) -> None:
        """Serve the fixed agreement to the followers (after the leader registered it)."""
        with self.cond:
            self.published = True
            self.cond.notify_all()

    def mark_told(self, curator: str) -> None:
        """Record that ``curator`` was sent the failure."""
        with self.cond:
            self.told.add(curator)
            self.cond.notify_all()

    def wait_all_told(self, timeout: float) -> bool:
        """Until every follower was sent the failure (True) or ``timeout``."""
        followers = set(self.curators[1:])
        with self.cond:
            return self.cond.wait_for(lambda: followers <= self.told, timeout)

    def add_tags(self, curator: str, tags: TagArray, alphabet_size: int) -> None:
        """Record a curator's tags and alphabet size (an identical resubmission is a no-op).

        A size that contradicts ``expected_sizes`` fails the whole agreement at once and raises
        :class:`AlphabetSizeMismatchError`; new tags after the agreement is fixed raise
        :class:`AgreementFixedError`.
        """
        with self.cond:
            if self.error is not None:
                raise AgreementError(self.error)
            try:
                size = self._checked_size(curator, alphabet_size)
            except AlphabetSizeMismatchError as exc:
                if self.agreement is None:
                    self._fail(str(exc))
                raise
            if self.agreement is not None:
                if self._is_resubmission(curator, tags, size):
                    return
                raise AgreementFixedError(
                    f"the agreement of release {self.release_id!r} is already fixed; "
                    f"{curator!r} can only resubmit the same tags"
                )
            self.tags[curator] = tags
            self.sizes[curator] = size
            self.cond.notify_all()

    def wait_all_tags(self, timeout: float) -> bool:
        """Until every curator's tags arrived (True), the agreement failed, or the timeout."""
        with self.cond:
            arrived = self.cond.wait_for(
                lambda: self.error is not None or set(self.curators) <= set(self.tags), timeout
            )
            return arrived and self.error is None

    def collect(self, timeout: float) -> Agreement:
        """Wait for every curator's tags, then fix the agreement. On a failure or after
        ``timeout`` seconds, fail the release for everybody and raise :class:`AgreementError`."""
        if not self.wait_all_tags(timeout):
            with self.cond:
                if self.error is None:
                    missing = sorted(set(self.curators) - set(self.tags))
                    self._fail(f"timed out after {timeout:g} s waiting for the tags of {missing}")
                raise AgreementError(self.error)
        return self.agree()

    def agree(self) -> Agreement:
        """Common tags, plan and seed (once every curator's tags arrived); wakes the waiters.
        A failure (e.g. no id common to all) fails the agreement for the followers too."""
        with self.cond:
            if self.agreement is None:
                try:
                    self.agreement = leader_agree(
                        self.release_id,
                        self.curators,
                        self.tags,
                        self.sizes,
                        self.epsilon,
                        self.m,
                        self.cipher,
                        self.researchers,
                        self.seed,
                    )
                except SecureReleaseError as exc:  # e.g. no common ids: tell the followers too
                    self._fail(f"{type(exc).__name__}: {exc}")
                    raise
                self.cond.notify_all()
            return self.agreement

    def wait_agreement(self, timeout: float) -> Agreement | None:
        """The agreement once published (None after ``timeout``); raises AgreementError if failed."""
        with self.cond:
            self.cond.wait_for(lambda: self.published or self.error is not None, timeout)
            if self.error is not None:
                raise AgreementError(self.error)
            return self.agreement if self.published else None

    def fail(self, message: str) -> None:
        """Fail the agreement: every waiting follower is told ``message``."""
        with self.cond:
            self._fail(message)

    def _fail(self, message: str) -> None:
        self.error = self.error or message
        self.cond.notify_all()
