"""What the leading curator collects for one release: every curator's tags and alphabet size,
guarded by one condition variable (the RPC threads add, the run thread waits). The agreement
itself is :func:`secure_release.mechanism.protocol.architectures.leader_agree_variant` (the sample fixed by a
seed or by an OS-drawn index tuple; the tags are keyed-hash or PSI tags alike).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from secure_release.curator.errors import (
    AgreementFixedError,
    AgreementNotReadyError,
    AlignmentModeMismatchError,
    AlphabetSizeMismatchError,
    PsiLimitError,
    PsiMismatchError,
    ReleaseRefusedError,
)
from secure_release.curator.psi_mailbox import PsiMailbox, SliceShape, whole_shape
from secure_release.curator.records.keystore import tags_digest
from secure_release.infra.exitcodes import is_refusal
from secure_release.infra.streams import (
    TAG_BYTES,
    WHOLE_STREAM,
    AgreementError,
    CallerNotAllowedError,
    PsiStreamError,
    TagBuffer,
    TagPart,
)
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, RowOrder, SortedTags, TagArray, align_all
from secure_release.mechanism.alignment.psi import POINT_BYTES, psi_leader_view
from secure_release.mechanism.alignment.psi_proof import ReblindProofError, proof_context, slice_context, verify_reblind
from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.architectures import (
    AlignmentMode,
    SamplingMode,
    VariantAgreement,
    leader_agree_variant,
)
from secure_release.mechanism.protocol.tables import TablesPlan


def psi_mismatch(curators: tuple[str, ...], tags: dict[str, TagArray]) -> PsiMismatchError:
    """The named error of a PSI ring whose tags match across no curators: for each curator, how
    many of its tags any other curator shares, and who re-blinded its list (a list no other
    curator's tags match was altered by one of them)."""
    lone = [c for c in curators if not any(np.intersect1d(tags[c], tags[o]).size for o in curators if o != c)]
    named = "; ".join(
        f"{c}'s tags match no other curator's (its list was re-blinded by {[o for o in curators if o != c]})"
        for c in lone
    )
    return PsiMismatchError(
        f"the PSI ring gave no id common to every curator: {named or 'every pair matches, only the triple is empty'}; "
        "a member sent group points that were not its honest re-blinding, or the tables share no id. The release "
        "is stopped; rerun it with the honest members only"
    )


class TagPartsError(AgreementError):
    """A follower's tag parts do not fit together: two of them name the same rows or hold tags of
    the same shard, or, once every part ended, their row ranges leave a gap or do not start at
    row 0 (parts must tile the rows 0 .. total in part order, each a run of whole shards)."""


@dataclass
class _PartRecord:
    """One part of a follower's tags as it arrives (or arrived)."""

    first_row: int
    received: int = 0  # tags so far
    digest: str = ""  # SHA-256 (hex) of the part's tag bytes, once it ended
    ended: bool = False
    streaming: bool = True
    joined: TagBuffer | None = None  # the in-process leader's copy of the part's tags


class TagParts:
    """One follower's tags as they arrive in :class:`TagPart` s (concurrent streams, one a shard
    range), held under the leader's ``cond``. The leader trusts a part's ``first_row`` for
    nothing but this bookkeeping: the parts' row ranges may never overlap while they grow (so
    together they hold at most the rows one stream may), and once every part ended they must
    tile [0, total) in part order (:class:`TagPartsError` otherwise)."""

    def __init__(self, curator: str, count: int) -> None:
        self.curator, self.count = curator, count
        self.records: dict[int, _PartRecord] = {}

    def start(self, part: TagPart) -> bool:
        """A stream of ``part`` begins; True if it replaces one already received (what was
        matched of it must be matched again). :class:`AgreementNotReadyError` while that part's
        own stream is still open."""
        held = self.records.get(part.index)
        if held is not None and held.streaming:
            what = "its tags" if self.count == 1 else f"part {part.index} of its tags"
            raise AgreementNotReadyError(f"{self.curator!r} is already sending {what}; retry when that stream ended")
        self.records[part.index] = _PartRecord(part.first_row)
        return held is not None

    @property
    def streaming(self) -> bool:
        return any(r.streaming for r in self.records.values())

    def grow(self, index: int, tags: int) -> None:
        """``tags`` more tags of part ``index`` arrived: :class:`TagPartsError` if its rows now
        overlap another part's."""
        record = self.records[index]
        record.received += tags
        start, stop = record.first_row, record.first_row + record.received
        if not record.received:  # an empty part names no row (the tiling places it)
            return
        for other, held in self.records.items():
            if other != index and held.received and start < held.first_row + held.received and held.first_row < stop:
                first, second = sorted((index, other))
                raise TagPartsError(
                    f"parts {first} and {second} of {self.curator!r}'s tags both name row "
                    f"{max(start, held.first_row)}: the parts' rows must tile 0 .. total in part order, no row twice"
                )

    def end(self, index: int, digest: str = "") -> None:
        record = self.records[index]
        record.ended, record.streaming, record.digest = True, False, digest

    def stop(self, index: int) -> None:
        """Part ``index``'s stream broke off: it has not ended (the follower sends it again)."""
        self.records[index].streaming = False

    @property
    def complete(self) -> bool:
        return len(self.records) == self.count and all(r.ended for r in self.records.values())

    def check_tiling(self) -> int:
        """(Every part ended.) The total rows, if the parts tile [0, total) in part order, else
        :class:`TagPartsError` naming the first part that does not start where the one before
        it ended."""
        total = 0
        for index in range(self.count):
            record = self.records[index]
            if record.first_row != total:
                before = "row 0 (the first part)" if index == 0 else f"row {total}, where part {index - 1} ended"
                raise TagPartsError(
                    f"part {index} of {self.curator!r}'s tags starts at row {record.first_row}, not at {before}: "
                    "the parts' rows must tile 0 .. total in part order, with no gap and no row twice"
                )
            total += record.received
        return total

    def digest(self) -> str:
        """The follower's tag digest: the one stream's own, or SHA-256 over the parts' digests in
        part order (a resend of the same parts, in any arrival order, gives the same digest)."""
        if self.count == 1:
            return self.records[0].digest
        joined = "".join(self.records[i].digest for i in range(self.count))
        return hashlib.sha256(joined.encode("ascii")).hexdigest()

    def joined_tags(self) -> TagArray:
        """(Every part ended, in process.) The parts' tags joined in part order (as sent: a
        plain concatenate would turn the big-endian tags native)."""
        buffers = [self.records[i].joined for i in range(self.count)]
        return np.concatenate([b.tags() for b in buffers if b is not None], dtype=TAG_DTYPE)


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
    sampling: SamplingMode = SamplingMode.SEED
    alignment: AlignmentMode = AlignmentMode.KEYED_HASH
    tags: dict[str, TagArray] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    agreement: VariantAgreement | None = None
    published: bool = False  # followers are served the agreement only once the leader registered it
    digests: dict[str, str] = field(default_factory=dict)  # each curator's tag digest (taken as they arrive)
    rows: dict[str, RowOrder] = field(default_factory=dict)  # each curator's rows in the canonical order
    own_sorted: SortedTags | None = None  # the leader's own tags, sorted (its matching reuses the sort)
    told: set[str] = field(default_factory=set)  # followers already sent the failure
    error: str | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)
    max_points: int = 1 << 24  # PSI: points a ring list may hold (--max-rows)
    psi_dir: Path | None = None  # PSI: where the mailbox keeps the lists (None: in memory)
    _psi_mailbox: PsiMailbox | None = field(default=None, repr=False)
    psi_domain_tags: list[TagArray] | None = None  # PSI: the leader's own tags in every curator's domain
    tables: TablesPlan | None = None  # --design: the spec is the design's tables (spec.designed_spec)
    parts: dict[str, TagParts] = field(default_factory=dict)  # follower -> its tags' parts as they arrive

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

    def _is_resubmission(self, curator: str, digest: str, size: int) -> bool:
        if self.agreement is None or curator not in self.digests:
            return False
        return self.digests[curator] == digest and self.agreement.base.spec.alphabet_of(curator) == size

    # ------------------------------------------------------------ PSI ring (the leader is the mailbox)
    @property
    def psi_mailbox(self) -> PsiMailbox:
        """The ring's lists (:mod:`secure_release.curator.psi_mailbox`): in memory, or in files
        under ``psi_dir`` once set (a leader of a release: kept in its keystore, so a restart
        takes them again, with each sender's pinned public key)."""
        if self._psi_mailbox is None:
            self._psi_mailbox = PsiMailbox(self.psi_dir)
        return self._psi_mailbox

    def leave_psi_mailbox(self) -> None:
        """This run is over: forget the mailbox without removing its files (the keystore deletes
        them once the release record is saved sealed, or the release is dropped; until then a
        rerun of this leader takes them again). A directory that holds nothing is removed."""
        with self.cond:
            if self.psi_dir is not None:
                with contextlib.suppress(OSError):  # not empty (kept), or gone already
                    os.rmdir(self.psi_dir)
            self._psi_mailbox, self.psi_dir = None, None

    def psi_route(self, owner: str, hop: int) -> tuple[str, str]:
        """(sender, recipient) of ``owner``'s list after ``hop`` blindings: curator
        (owner + hop - 1) mod N hands it to curator (owner + hop) mod N (hop N: back to the
        owner). :class:`PsiStreamError` for an owner or hop outside the ring."""
        num = len(self.curators)
        if owner not in self.curators or not 1 <= hop <= num:
            raise PsiStreamError(f"release {self.release_id!r} routes no PSI list of {owner!r} at hop {hop}")
        at = self.curators.index(owner)
        return self.curators[(at + hop - 1) % num], self.curators[(at + hop) % num]

    def psi_admit(self, sender: str, owner: str, hop: int, count: int, shape: SliceShape | None = None) -> None:
        """Before any point is buffered: ``sender`` is due to send ``owner``'s list at ``hop``, the
        agreement is in PSI mode and not failed, and the list's size (``count``, or a slice's
        ``shape.total``) is within ``max_points`` and (after the first hop) the owner's list's."""
        self.check_alignment(sender, AlignmentMode.PSI)
        due, _ = self.psi_route(owner, hop)
        if sender != due:
            raise CallerNotAllowedError(
                f"{sender!r} may not send the PSI list of {owner!r} at hop {hop}; the ring has {due!r} send it"
            )
        total = count if shape is None else shape.total
        if total > self.max_points:
            raise PsiLimitError(
                f"{sender!r} sent a PSI list of {total} points; the leader accepts at most --max-rows = "
                f"{self.max_points}"
            )
        with self.cond:
            if self.error is not None:
                raise self._failure()
            known = self.psi_mailbox.totals.get(owner)
            try:
                if hop > 1 and known != total:
                    raise PsiStreamError(
                        f"the PSI list of {owner!r} has {known} points, {sender!r} sent {total} at hop {hop}"
                    )
                if shape is not None:
                    self.psi_mailbox.admit(owner, hop, shape)
            except PsiStreamError as error:
                if known is not None:  # a member's wrong list ends the release for everybody now
                    self._fail(f"{sender!r} sent a wrong PSI list: {error}")
                raise

    def psi_put(
        self, sender: str, owner: str, hop: int, points: bytes, proof: bytes = b"", public: bytes = b""
    ) -> None:
        """Hold ``owner``'s whole list at ``hop`` for its next curator (an identical resend is a
        no-op; a list the owner sent in slices is cut into them). A follower's re-blinding
        (hop >= 2) must come with a proof that it is the previous hop's list raised to the
        sender's key (pinned at its first list); one that does not verify ends the release for
        everybody at once, naming the sender."""
        self.psi_admit(sender, owner, hop, len(points) // POINT_BYTES)
        if hop > 1 and sender != self.curators[0]:
            with self.cond:
                before = self.psi_mailbox.whole(owner, hop - 1) or b""
            self._check_reblind(sender, owner, hop, before, points, proof, public, proof_context(owner, hop))
        with self.cond:
            mailbox = self.psi_mailbox
            pieces = [(whole_shape(len(points) // POINT_BYTES), points)] if hop == 1 else mailbox.split(owner, points)
            for shape, piece in pieces:
                self._store(sender, owner, hop, shape, piece)

    def psi_put_slice(
        self, sender: str, owner: str, hop: int, shape: SliceShape, points: bytes, proof: bytes = b"",
        public: bytes = b"",
    ) -> None:  # fmt: skip
        """:meth:`psi_put` of one slice (a curator on a cluster): its proof covers the slice."""
        self.psi_admit(sender, owner, hop, shape.total, shape)
        if hop > 1 and sender != self.curators[0]:
            with self.cond:
                before = self.psi_mailbox.get(owner, hop - 1, shape.index) or b""
            context = slice_context(owner, hop, shape.index, shape.slices)
            self._check_reblind(sender, owner, hop, before, points, proof, public, context)
        with self.cond:
            self._store(sender, owner, hop, shape, points)

    def _store(self, sender: str, owner: str, hop: int, shape: SliceShape, points: bytes) -> None:
        """(Under ``cond``.) One slice into the mailbox; a different resend fails the release."""
        try:
            self.psi_mailbox.put(owner, hop, shape, points)
        except PsiStreamError as exc:
            self._fail(f"{sender!r} sent a wrong PSI list: {exc}")
            raise
        self.cond.notify_all()

    def _check_reblind(
        self, sender: str, owner: str, hop: int, before: bytes, points: bytes, proof: bytes, public: bytes,
        context: bytes,
    ) -> None:  # fmt: skip
        with self.cond:
            pinned = self.psi_mailbox.pin(sender, public)  # kept with the slices: a restart holds it too
        try:
            if public != pinned:
                raise ReblindProofError(f"the public key differs from the one {sender!r} sent with its first list")
            verify_reblind(public, context, before, points, proof)
        except ReblindProofError as exc:
            message = (
                f"{sender!r} sent a wrong PSI list: its re-blinding of {owner!r}'s list at hop {hop} does not "
                f"verify ({exc})"
            )
            self.fail(message)
            raise ReblindProofError(message) from None

    def _psi_wait(self, recipient: str, owner: str, hop: int, timeout: float, ready: Callable[[], bool]) -> bool:
        """Wait until ``ready()`` (under ``cond``), for the curator the list is routed to."""
        self.check_alignment(recipient, AlignmentMode.PSI)
        _, due = self.psi_route(owner, hop)
        if recipient != due:
            raise CallerNotAllowedError(f"the PSI list of {owner!r} at hop {hop} goes to {due!r}, not {recipient!r}")
        with self.cond:
            self.cond.wait_for(lambda: self.error is not None or ready(), timeout)
            if self.error is not None:
                raise self._failure()
            return ready()

    def psi_get(self, recipient: str, owner: str, hop: int, timeout: float) -> bytes | None:
        """``owner``'s whole list at ``hop`` once every slice arrived, to the curator it is routed
        to (None after ``timeout``); raises :class:`AgreementError` once the agreement failed."""
        if not self._psi_wait(recipient, owner, hop, timeout, lambda: self.psi_mailbox.complete(owner, hop)):
            return None
        with self.cond:
            return self.psi_mailbox.whole(owner, hop)

    def psi_get_slice(
        self, recipient: str, owner: str, hop: int, index: int, timeout: float
    ) -> tuple[SliceShape, bytes] | None:
        """Slice ``index`` of ``owner``'s list at ``hop`` once it arrived (None after ``timeout``)."""
        if not self._psi_wait(recipient, owner, hop, timeout, lambda: self.psi_mailbox.has(owner, hop, index)):
            return None
        with self.cond:
            shape = self.psi_mailbox.shape(owner, index)
            points = self.psi_mailbox.get(owner, hop, index)
        assert shape is not None and points is not None
        return shape, points

    def restore(
        self, agreement: VariantAgreement, digests: dict[str, str], rows: dict[str, RowOrder] | None = None
    ) -> None:
        """Take back the agreement a previous run of this leader fixed and persisted (not yet
        published: the leader registers it first), with every curator's row order."""
        with self.cond:
            self.agreement, self.digests = agreement, dict(digests)
            self.rows = dict(rows or {})

    def rows_of(self, curator: str) -> RowOrder | None:
        """``curator``'s rows in the canonical order (None: not known here, e.g. an agreement
        persisted by an older version; the common tags are served instead)."""
        with self.cond:
            return self.rows.get(curator)

    def forget_tags(self) -> None:
        """Drop every curator's tags once the agreement is fixed and persisted, keeping their
        digests (an identical resubmission is still recognised): at n = 10^7 each list is 160 MB
        the leader no longer needs."""
        with self.cond:
            if self.agreement is not None and self.tags:
                self.tags.clear()  # their digests were taken as they arrived

    def tag_digests(self) -> dict[str, str]:
        """Every curator's tag digest (what :meth:`restore` needs after a restart)."""
        with self.cond:
            return dict(self.digests)

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

    def check_alignment(self, curator: str, mode: AlignmentMode) -> None:
        """A curator that aligns differently fails the whole agreement (every curator is told
        why) with :class:`AlignmentModeMismatchError`."""
        if mode is self.alignment:
            return
        with self.cond:
            message = (
                f"release {self.release_id!r}: curator {curator!r} aligns by {mode.value}, "
                f"the leader by {self.alignment.value} (--alignment must be the same at every curator)"
            )
            if self.agreement is None:
                self._fail(message)
        raise AlignmentModeMismatchError(message)

    def add_tags(
        self, curator: str, tags: TagArray, alphabet_size: int, alignment: AlignmentMode | None = None
    ) -> None:
        """Record a curator's tags and alphabet size (an identical resubmission is a no-op).

        A size that contradicts ``expected_sizes``, or tags made by another alignment mode,
        fail the whole agreement at once (:class:`AlphabetSizeMismatchError`,
        :class:`AlignmentModeMismatchError`); new tags after the agreement is fixed raise
        :class:`AgreementFixedError`.
        """
        self.check_alignment(curator, self.alignment if alignment is None else alignment)
        digest = tags_digest(tags)  # outside the lock: SHA-256 of 160 MB at 10^7 ids takes ~0.3 s
        with self.cond:
            if self.error is not None:
                raise self._failure()
            try:
                size = self._checked_size(curator, alphabet_size)
            except AlphabetSizeMismatchError as exc:
                if self.agreement is None:
                    self._fail(str(exc))
                raise
            if self.agreement is not None:
                if self._is_resubmission(curator, digest, size):
                    return
                raise AgreementFixedError(
                    f"the agreement of release {self.release_id!r} is already fixed; "
                    f"{curator!r} can only resubmit the same tags"
                )
            self.tags[curator] = tags
            self.digests[curator] = digest
            self.sizes[curator] = size
            self.cond.notify_all()

    def add_tag_stream(
        self, curator: str, pieces: Iterable[bytes], alphabet_size: int, alignment: AlignmentMode,
        part: TagPart = WHOLE_STREAM,
    ) -> int:  # fmt: skip
        """A follower's tags as they arrive (the byte pieces of its TagChunk stream), joined and
        recorded by :meth:`add_tags`; returns how many arrived. A ``part`` of them (a follower on
        a cluster sends its tags as concurrent streams) is held until every part ended; the
        parts, checked to tile its rows, are then joined in part order and recorded."""
        if part.whole:
            joined = TagBuffer()
            for piece in pieces:
                joined.add(piece)
            tags = joined.tags()
            self.add_tags(curator, tags, alphabet_size, alignment)
            return int(tags.size)
        self.check_alignment(curator, alignment)
        with self.cond:
            parts = self._buffered_parts(curator, part)
        joined = self._join_part(parts, part, pieces)
        with self.cond:
            parts.end(part.index)
            parts.records[part.index].joined = joined
            if self.parts.get(curator) is not parts or not parts.complete:
                return len(joined) // TAG_BYTES
            self._checked_tiling(parts)
            tags = parts.joined_tags()
            del self.parts[curator]  # joined: a later part starts the next set (a resend of every part)
        self.add_tags(curator, tags, alphabet_size, alignment)
        return len(joined) // TAG_BYTES

    def _buffered_parts(self, curator: str, part: TagPart) -> TagParts:
        """(Under ``cond``.) The in-process leader's set of ``curator``'s parts that ``part``
        belongs to: a new set for another part count, or once the last set was joined."""
        parts = self.parts.get(curator)
        if parts is None or parts.count != part.count:
            if parts is not None and parts.streaming:
                raise AgreementNotReadyError(
                    f"{curator!r} is already sending its tags in {parts.count} parts; retry when they ended"
                )
            parts = self.parts[curator] = TagParts(curator, part.count)
        parts.start(part)
        return parts

    def _join_part(self, parts: TagParts, part: TagPart, pieces: Iterable[bytes]) -> TagBuffer:
        """A part's tags joined as they arrive, its rows checked against the other parts' at
        every piece (so the parts together hold at most the rows of one whole stream)."""
        joined = TagBuffer()
        try:
            for piece in pieces:
                if len(piece) % TAG_BYTES:
                    raise ShapeMismatchError(f"{len(piece)} tag bytes is not a multiple of {TAG_BYTES}")
                with self.cond:
                    self._checked_growth(parts, part.index, len(piece) // TAG_BYTES)
                joined.add(piece)
        except BaseException:
            with self.cond:
                parts.stop(part.index)
            raise
        return joined

    def _checked_growth(self, parts: TagParts, index: int, tags: int) -> None:
        """(Under ``cond``.) :meth:`TagParts.grow`; parts that overlap fail the agreement."""
        try:
            parts.grow(index, tags)
        except TagPartsError as exc:
            self._part_failure(exc)
            raise

    def _checked_tiling(self, parts: TagParts) -> int:
        """(Under ``cond``.) :meth:`TagParts.check_tiling`; parts that do not tile fail the agreement."""
        try:
            return parts.check_tiling()
        except TagPartsError as exc:
            self._part_failure(exc)
            raise

    def _part_failure(self, exc: TagPartsError) -> None:
        """(Under ``cond``.) A follower whose parts do not fit together fails the agreement for
        every party (it cannot be fixed by a resend), unless it is fixed already (a wrong resend
        is only refused)."""
        if self.agreement is None:
            self._fail(f"release {self.release_id!r}: {type(exc).__name__}: {exc}")

    def wait_all_tags(self, timeout: float) -> bool:
        """Until every curator's tags arrived (True), the agreement failed, or the timeout."""
        with self.cond:
            arrived = self.cond.wait_for(
                lambda: self.error is not None or set(self.curators) <= set(self.tags), timeout
            )
            return arrived and self.error is None

    def collect(self, timeout: float, waited: float | None = None) -> VariantAgreement:
        """Wait for every curator's tags, then fix the agreement. On a failure or after
        ``timeout`` seconds, fail the release for everybody and raise :class:`AgreementError`
        (``waited``: the whole wait the message names, if longer than this last part)."""
        if not self.wait_all_tags(timeout):
            with self.cond:
                if self.error is None:
                    missing = sorted(set(self.curators) - set(self.tags))
                    self._fail(f"timed out after {waited or timeout:g} s waiting for the tags of {missing}")
                raise self._failure()
        return self.agree()

    def _matched_lists(self) -> list[TagArray]:
        """Every curator's tags as the leader matches them: as sent (keyed hash, or PSI at N = 2,
        where the leader's own tags are in its follower's domain), or with PSI each follower's
        tags (its own domain) mapped onto the leader's rows (``psi_leader_view``; tags of ids the
        leader does not hold match nothing)."""
        lists = [self.tags[c] for c in self.curators]
        if self.alignment is not AlignmentMode.PSI or len(lists) == 2:  # N = 2: both in domain 1 (leader_domain)
            return lists
        if self.psi_domain_tags is None or len(self.psi_domain_tags) != len(self.curators):
            raise AgreementError(f"release {self.release_id!r}: the leader has no PSI tags of its own in every domain")
        view = psi_leader_view(self.psi_domain_tags, dict(enumerate(lists[1:], start=1)))
        return [lists[0], *(view[j] for j in range(1, len(lists)))]

    def agree(self) -> VariantAgreement:
        """Common tags, plan and the sample (a seed, or an index tuple drawn from the OS CSPRNG),
        once every curator's tags arrived; wakes the waiters. A failure (e.g. no id common to
        all) fails the agreement for the followers too."""
        with self.cond:
            if self.agreement is None:
                try:
                    common = None
                    if set(self.curators) <= set(self.tags):  # one matching gives every curator's rows
                        common, alignments = align_all(self._matched_lists(), self.own_sorted)
                        self.rows = {c: a.row_order for c, a in zip(self.curators, alignments, strict=True)}
                        if self.alignment is AlignmentMode.PSI and common.size == 0:
                            raise psi_mismatch(self.curators, self.tags)
                    self.agreement = leader_agree_variant(
                        self.release_id,
                        self.curators,
                        self.tags,
                        self.sizes,
                        self.epsilon,
                        self.m,
                        self.cipher,
                        self.sampling,
                        self.alignment,
                        self.researchers,
                        seed=self.seed,
                        common=common,
                        tables=self.tables,
                    )
                except SecureReleaseError as exc:  # e.g. no common ids: tell the followers too
                    self._fail(f"{type(exc).__name__}: {exc}")
                    raise
                self.cond.notify_all()
            return self.agreement

    def wait_agreement(self, timeout: float) -> VariantAgreement | None:
        """The agreement once published (None after ``timeout``); raises AgreementError if failed."""
        with self.cond:
            self.cond.wait_for(lambda: self.published or self.error is not None, timeout)
            if self.error is not None:
                raise self._failure()
            return self.agreement if self.published else None

    def fail(self, message: str) -> None:
        """Fail the agreement: every waiting follower is told ``message``."""
        with self.cond:
            self._fail(message)

    def _failure(self) -> SecureReleaseError:
        """The error the failed agreement is reported as: a refusal (exit 3 at every party)
        when the reason records one, else :class:`AgreementError`."""
        assert self.error is not None
        return ReleaseRefusedError(self.error) if is_refusal(self.error) else AgreementError(self.error)

    def _fail(self, message: str) -> None:
        self.error = self.error or message
        self.cond.notify_all()
