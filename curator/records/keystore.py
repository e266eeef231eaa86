"""A curator's secrets on disk: per release, its pad and sample (``release-<id>.json``), at
the leader, the agreement it serves (``agreement-<id>.json``), and per stored table (for
server-side sampling) its table key and what a release from it needs (``table-<id>.json``). The
privacy ledger lives beside them (:mod:`secure_release.curator.records.ledgerfile`).

Every file is written atomically (temporary file in the same directory, fsync, rename, fsync of
the directory) with mode 0600; the directory is 0700. A release record is written before the
first upload, so a restarted curator re-derives exactly the same ciphertext
(:meth:`ReleaseRecord.ciphertext`), and it names the table fingerprint the sample came from, so a
pad is never applied to different plaintext.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.infra.fileio import UnsafePathError, atomic_write, open_nofollow, private_dir, read_nofollow
from secure_release.infra.streams import tags_from_bytes
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray
from secure_release.mechanism.alignment.psi import PsiKey
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.primitives.keys import PadKey, Seed
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, VariantAgreement
from secure_release.mechanism.protocol.in_memory import Agreement
from secure_release.mechanism.protocol.server_sampling import TableKey
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.schema import Attribute, CuratorSchema, SymbolArray


class KeystoreError(SecureReleaseError):
    """The keystore is unreadable or a release file is malformed."""

    kind = ErrorKind.FAILED_PRECONDITION


class TableChangedError(SecureReleaseError):
    """A resumed release's table no longer hashes to the fingerprint its pad was applied to."""

    kind = ErrorKind.FAILED_PRECONDITION


def _safe(release_id: str) -> str:
    if not release_id or any(c in release_id for c in "/\\\0") or release_id.startswith("."):
        raise KeystoreError(f"release id {release_id!r} is not a safe file name")
    return release_id


def _symbol_dtype(alphabet_size: int) -> str:
    """The narrowest little-endian unsigned type that holds symbols below ``alphabet_size``."""
    return "<u1" if alphabet_size <= 1 << 8 else "<u2" if alphabet_size <= 1 << 16 else "<u4"


def _u32(symbols: SymbolArray, alphabet_size: int = 1 << 32) -> str:
    """Base64 of the symbols, each in the narrowest width the alphabet needs (1 byte for most)."""
    return base64.b64encode(np.asarray(symbols).astype(_symbol_dtype(alphabet_size)).tobytes()).decode()


def _from_u32(text: str, alphabet_size: int = 1 << 32) -> SymbolArray:
    return np.frombuffer(base64.b64decode(text), dtype=_symbol_dtype(alphabet_size)).astype(np.uint32)


@dataclass(frozen=True)
class SampleFile:
    """A sample too large for the record's JSON (a curator on a cluster writes it as the ranges
    arrive): its symbols in ``sample-<id>.bin`` beside the record (0600), each in the narrowest
    width of its alphabet; the record names the file, the count and the SHA-256."""

    path: Path
    count: int
    alphabet_size: int
    sha256: str

    @property
    def dtype(self) -> str:
        return _symbol_dtype(self.alphabet_size)

    def read(self, start: int, count: int) -> SymbolArray:
        """Symbols [start, start + count) as uint32 (the file is opened without following links)."""
        width = np.dtype(self.dtype).itemsize
        fd = open_nofollow(self.path, os.O_RDONLY, None)
        with os.fdopen(fd, "rb") as fh:
            fh.seek(width * start)
            raw = fh.read(width * count)
        if len(raw) != width * count:
            raise KeystoreError(f"{self.path} is shorter than its record says ({self.count} symbols)")
        return np.frombuffer(raw, dtype=self.dtype).astype(np.uint32)

    def verify(self) -> None:
        """:class:`KeystoreError` unless the file holds exactly the recorded symbols (size and
        SHA-256, read a MiB at a time): a sample changed on disk would meet the recorded pad."""
        digest, size = hashlib.sha256(), 0
        try:
            fd = open_nofollow(self.path, os.O_RDONLY, None)
        except FileNotFoundError:
            raise KeystoreError(f"{self.path}: the sample file of this release record is missing") from None
        with os.fdopen(fd, "rb") as fh:
            while piece := fh.read(1 << 20):
                digest.update(piece)
                size += len(piece)
        if size != self.count * np.dtype(self.dtype).itemsize or digest.hexdigest() != self.sha256:
            raise KeystoreError(
                f"{self.path} does not hold the sample its record names ({self.count} symbols, SHA-256 "
                f"{self.sha256[:16]}...); a pad is never applied to other plaintext: restore it or abort the release"
            )


@dataclass(frozen=True)
class ReleaseRecord:
    """What a curator must keep to resume a release and serve its key: the spec it registers,
    its pad, its sampled plaintext symbols, the table fingerprint, and when key service ends."""

    spec: ReleaseSpec
    pad: ReleasePad
    sample: SymbolArray
    table_fingerprint: str
    dataset_name: str
    seed_fingerprint: str  # the sample's fingerprint (the seed's, or the packed index tuple's)
    retention_until: float | None = None  # set once the release is sealed
    sampling: SamplingMode = SamplingMode.SEED  # how the sample was shared (says where its randomness comes from)
    table_id: str = ""  # server-sampled: the stored table; ``sample`` then holds -v_p mod k, not plaintext
    sample_file: SampleFile | None = None  # the sample in a file beside the record (``sample`` is then empty)
    design_json: bytes = b""  # a release of a design's tables: the design file, served with the key

    def sample_slice(self, start: int, count: int) -> SymbolArray:
        """The sampled symbols [start, start + count) (from the sample file if there is one)."""
        if self.sample_file is not None:
            return self.sample_file.read(start, count)
        return self.sample[start : start + count]

    def ciphertext_chunk(self, seq: int) -> bytes:
        """Upload chunk ``seq`` (CHUNK_ROWS symbols, the last one shorter): its slice of the
        sample under its slice of the pad, packed. Only the chunk's pad range is computed, so a
        chunk at a time needs memory for a chunk, whatever m."""
        m, k = self.pad.length, self.pad.alphabet_size
        start = seq * CHUNK_ROWS
        count = min(CHUNK_ROWS, m - start)
        if seq < 0 or count <= 0:
            raise KeystoreError(f"chunk {seq} is outside the {-(-m // CHUNK_ROWS)} chunks of m = {m}")
        return pack_symbols(self.pad.encrypt_range(self.sample_slice(start, count), start), k)

    def ciphertext(self) -> SymbolArray:
        """The ciphertext this record always uploads: its pad over its own sample. Pad and
        sample are bound in one record, so a replay re-derives the same bytes and the pad never
        meets other plaintext. For a server-sampled release (``table_id``) ``sample`` holds the
        negated table pads at the server's positions, so this is the re-key column
        delta = (w - v_p) mod k (``server_sampling.curator_rekey``)."""
        return self.pad.encrypt_range(self.sample_slice(0, self.pad.length), 0)

    def check_table(self, fingerprint: str) -> None:
        """:class:`TableChangedError` unless the table still hashes to the recorded fingerprint."""
        if fingerprint != self.table_fingerprint:
            raise TableChangedError(
                f"release {self.spec.release_id!r} was prepared from a table with SHA-256 "
                f"{self.table_fingerprint[:16]}..., the data file now hashes to {fingerprint[:16]}...; a pad is "
                "never applied to different plaintext: restore the original file to resume, or abort the release "
                "('secure-release-curator release abort ID')"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (holds secrets: only ever written 0600)."""
        pad = self.pad
        secret = {"chacha20_key": pad.key.reveal().hex()} if pad.key is not None else {}
        if pad.pad_symbols is not None:
            secret = {"otp_pad": _u32(pad.pad_symbols, pad.alphabet_size)}
        return {
            "spec": self.spec.to_dict(),
            "mode": pad.mode.value,
            "alphabet_size": pad.alphabet_size,
            "length": pad.length,
            **secret,
            "symbol_width": np.dtype(_symbol_dtype(pad.alphabet_size)).itemsize,
            **self._sample_fields(),
            "table_fingerprint": self.table_fingerprint,
            "dataset_name": self.dataset_name,
            "seed_fingerprint": self.seed_fingerprint,
            "retention_until": self.retention_until,
            "sampling": "server" if self.table_id else self.sampling.value,
            "sampling_randomness": (
                "pseudorandom (the server's fresh seed expanded by ChaCha20; computational against the researcher)"
                if self.table_id
                else self.sampling.randomness
            ),
            **({"table_id": self.table_id} if self.table_id else {}),
            **({"design": _b64(self.design_json)} if self.design_json else {}),
            **({"segments": [list(x) for x in pad.segments]} if pad.segments is not None else {}),
        }

    def _sample_fields(self) -> dict[str, Any]:
        """The sample in the record: inline (base64), or the file's name, count and SHA-256."""
        if self.sample_file is None:
            return {"sample": _u32(self.sample, self.pad.alphabet_size)}
        f = self.sample_file
        return {"sample_file": f.path.name, "sample_count": f.count, "sample_sha256": f.sha256}

    @classmethod
    def from_dict(cls, data: dict[str, Any], directory: Path | None = None) -> ReleaseRecord:
        """Inverse of :meth:`to_dict`; ``directory``: where a sample file is (the keystore)."""
        mode = CipherMode(data["mode"])
        k, length = int(data["alphabet_size"]), int(data["length"])
        width = k if "symbol_width" in data else 1 << 32  # records of older versions: 4 bytes a symbol
        spec = ReleaseSpec.from_dict(data["spec"])
        segments = _segments(spec, data.get("segments"), k)
        if mode is CipherMode.CHACHA20:
            pad = ReleasePad(mode, k, length, key=PadKey(bytes.fromhex(data["chacha20_key"])), segments=segments)
        else:
            pad = ReleasePad(mode, k, length, pad_symbols=_from_u32(data["otp_pad"], width), segments=segments)
        until = data.get("retention_until")
        sample_file = None
        if "sample_file" in data:
            name = str(data["sample_file"])
            if directory is None or Path(name).name != name or not name.startswith("sample-"):
                raise ValueError(f"sample file {name!r} is not a sample file of this keystore")
            sample_file = SampleFile(directory / name, int(data["sample_count"]), k, str(data["sample_sha256"]))
        return cls(
            spec,
            pad,
            _from_u32(data["sample"], width) if sample_file is None else np.zeros(0, dtype=np.uint32),
            str(data["table_fingerprint"]),
            str(data["dataset_name"]),
            str(data["seed_fingerprint"]),
            None if until is None else float(until),
            SamplingMode.SEED if data.get("table_id") else SamplingMode.parse(str(data.get("sampling", "seed"))),
            str(data.get("table_id", "")),
            sample_file,
            base64.b64decode(data["design"]) if "design" in data else b"",
        )


def _segments(spec: ReleaseSpec, stored: Any, alphabet_size: int) -> tuple[tuple[int, int], ...] | None:
    """A record's pad segments (a designed release: one (m_t, k_t) a table), checked against its
    spec: they are one curator's ``spec.segments_of``, of the pad's alphabet; none for the whole
    joint. A record whose pad would not decrypt as the researcher rebuilds it is refused."""
    segments = None if stored is None else tuple((int(m), int(k)) for m, k in stored)
    if not spec.designed:
        if segments is not None:
            raise ValueError("a record of the whole joint holds table segments")
        return None
    fits = [c for c in spec.curators if spec.segments_of(c) == segments and spec.alphabet_of(c) == alphabet_size]
    if not fits:
        raise ValueError("the record's pad segments are no curator's tables of its spec")
    return segments


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def agreement_to_dict(
    agreement: VariantAgreement, tag_digests: dict[str, str], tag_files: dict[str, str]
) -> dict[str, Any]:
    """The leader's agreement (spec, modes, seed or packed index tuple), each curator's tag
    digest, and the SHA-256 of each binary tag file beside it (``tag_files``: the common tags
    and, with PSI, the leader's own tags, which a restart cannot recompute)."""
    base = agreement.base
    data: dict[str, Any] = {
        "spec": base.spec.to_dict(),
        "seed": base.seed.reveal().hex(),
        "tag_files": tag_files,
        "tag_digests": tag_digests,
        "sampling": agreement.sampling.value,
        "alignment": agreement.alignment.value,
    }
    if agreement.packed_indices is not None:
        data["packed_indices"] = _b64(agreement.packed_indices)
    return data


def tags_digest(tags: TagArray) -> str:
    """SHA-256 of a curator's tag bytes (how a restarted leader recognises a resubmission)."""
    return hashlib.sha256(np.ascontiguousarray(tags).tobytes()).hexdigest()


@dataclass(frozen=True)
class StoredAgreement:
    """What a leader persisted when it fixed the agreement."""

    agreement: VariantAgreement
    digests: dict[str, str]
    own_tags: TagArray | None = None  # PSI only: the leader's tags (its scalar is not kept)
    rows: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)  # each curator's rows, canonical order


def schema_to_dict(schema: CuratorSchema) -> dict[str, Any]:
    attributes = [{"name": a.name, "categories": list(a.categories)} for a in schema.attributes]
    return {"curator": schema.name, "attributes": attributes}


def schema_from_dict(data: dict[str, Any]) -> CuratorSchema:
    attributes = tuple(Attribute(str(a["name"]), tuple(str(c) for c in a["categories"])) for a in data["attributes"])
    return CuratorSchema(str(data["curator"]), attributes)


@dataclass(frozen=True)
class TableRecord:
    """A curator's stored table (server-side sampling): its table key (never leaves the
    keystore), the table's curators, n and alphabet sizes from the store-time agreement, this
    curator's schema (for the researcher's labels) and the digest of the ciphertext it uploaded.
    A release from the table needs only this record, not the data file."""

    table_id: str
    key: TableKey
    curators: tuple[str, ...]
    n: int
    alphabet_sizes: tuple[int, ...]
    schema: CuratorSchema
    table_fingerprint: str  # SHA-256 of the data file it was encrypted from
    dataset_name: str
    ciphertext_digest: str  # SHA-256 (hex) of the packed chunks uploaded
    alignment: AlignmentMode = AlignmentMode.KEYED_HASH

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (holds the table key: only ever written 0600)."""
        return {
            "table_id": self.table_id,
            "table_key": self.key.reveal().hex(),
            "curators": list(self.curators),
            "n": self.n,
            "alphabet_sizes": list(self.alphabet_sizes),
            "schema": schema_to_dict(self.schema),
            "table_fingerprint": self.table_fingerprint,
            "dataset_name": self.dataset_name,
            "ciphertext_digest": self.ciphertext_digest,
            "alignment": self.alignment.value,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableRecord:
        return cls(
            str(data["table_id"]),
            TableKey(bytes.fromhex(data["table_key"])),
            tuple(str(c) for c in data["curators"]),
            int(data["n"]),
            tuple(int(k) for k in data["alphabet_sizes"]),
            schema_from_dict(data["schema"]),
            str(data["table_fingerprint"]),
            str(data["dataset_name"]),
            str(data["ciphertext_digest"]),
            AlignmentMode.parse(str(data.get("alignment", "keyed-hash"))),
        )


class Keystore:
    """Directory of ``release-<id>.json``, ``agreement-<id>.json`` (with its ``.tags`` files) and
    the ledger, all 0600."""

    def __init__(self, directory: str | Path, signer: HeadSigner | None = None) -> None:
        """Open (or create, mode 0700) ``directory`` (a link or another user's directory is
        refused); ``signer`` signs and verifies the ledger's head."""
        self.directory = private_dir(Path(directory))
        self.ledger = LedgerFile(self.directory, signer)

    def _path(self, kind: str, release_id: str) -> Path:
        return self.directory / f"{kind}-{_safe(release_id)}.json"

    def _load(self, path: Path) -> dict[str, Any] | None:
        if not os.path.lexists(path):
            return None
        try:
            data: dict[str, Any] = json.loads(read_nofollow(path))
            return data
        except UnsafePathError:
            raise
        except (OSError, ValueError) as exc:
            raise KeystoreError(f"{path}: unreadable ({type(exc).__name__})") from exc

    # ------------------------------------------------------------ release records
    def save_record(self, record: ReleaseRecord) -> None:
        """Persist a release record (0600, fsync) - before the first upload. A PSI scalar kept
        for the release is deleted: aligned and sampled, this curator never needs the ring again.
        A leader's kept PSI mailbox goes once the record is saved sealed (``retention_until``
        set): every curator saved its own record before the release sealed, so none runs the
        ring again (until then a follower restarted before its record still fetches its lists)."""
        atomic_write(self._path("release", record.spec.release_id), json.dumps(record.to_dict()).encode())
        self.drop_psi_key(record.spec.release_id)
        if record.retention_until is not None:
            self.drop_psi_mailbox(record.spec.release_id)

    def load_record(self, release_id: str) -> ReleaseRecord | None:
        """The stored record of ``release_id`` (None if this curator never prepared it)."""
        data = self._load(self._path("release", release_id))
        if data is None:
            return None
        try:
            record = ReleaseRecord.from_dict(data, self.directory)
        except (KeyError, ValueError, TypeError) as exc:
            raise KeystoreError(f"release record of {release_id!r} is malformed ({type(exc).__name__})") from exc
        if record.sample_file is not None:
            record.sample_file.verify()
        return record

    def write_sample(self, release_id: str, pieces: Iterable[npt.NDArray[np.unsignedinteger]],
                     alphabet_size: int) -> SampleFile:  # fmt: skip
        """A release's sample written as its pieces arrive (in order) to ``sample-<id>.bin``
        (atomically, 0600, fsync): one piece in memory at a time. Written before the record
        that names it, and both before any upload."""
        path = self.directory / f"sample-{_safe(release_id)}.bin"
        digest, count = hashlib.sha256(), [0]
        dtype = _symbol_dtype(alphabet_size)

        def encoded() -> Iterator[bytes]:
            for piece in pieces:
                raw = np.asarray(piece).astype(dtype, copy=False).tobytes()
                digest.update(raw)
                count[0] += int(np.asarray(piece).size)
                yield raw

        atomic_write(path, encoded())
        return SampleFile(path, count[0], alphabet_size, digest.hexdigest())

    def drop_record(self, release_id: str) -> None:
        """Remove a release record (its release was aborted: it is never resumed or served)."""
        self._path("release", release_id).unlink(missing_ok=True)
        (self.directory / f"sample-{_safe(release_id)}.bin").unlink(missing_ok=True)
        self.drop_psi_key(release_id)
        self.drop_psi_mailbox(release_id)

    # ------------------------------------------------------------ a curator's PSI scalar (ring to record)
    def psi_key(self, release_id: str, fresh: PsiKey) -> tuple[PsiKey, bool]:
        """The PSI key an earlier run of this curator kept for ``release_id`` (it was killed
        during the ring or before its record: the same scalar makes every list it re-sends
        identical, so the leader's mailbox takes them again; a leader's own lists match those
        its kept mailbox holds), else ``fresh``, persisted now (0600, fsync) before any list
        leaves. True if the kept one was taken. Deleted with the record's save or drop."""
        path = self._path("psi-key", release_id)
        if os.path.lexists(path):
            try:
                return PsiKey(bytes.fromhex(json.loads(read_nofollow(path))["psi_key"])), True
            except (OSError, ValueError, KeyError, TypeError, SecureReleaseError) as exc:
                raise KeystoreError(f"the kept PSI key of {release_id!r} is unreadable ({type(exc).__name__})") from exc
        atomic_write(path, json.dumps({"psi_key": fresh.reveal().hex()}).encode())
        return fresh, False

    def drop_psi_key(self, release_id: str) -> None:
        """Delete the PSI key kept for ``release_id`` (if any)."""
        self._path("psi-key", release_id).unlink(missing_ok=True)

    # ------------------------------------------------------------ a leader's PSI mailbox (ring to seal)
    def psi_mailbox_dir(self, release_id: str) -> Path:
        """Where a leader keeps the PSI ring's lists of ``release_id``
        (:mod:`secure_release.curator.psi_mailbox`: blinded points only, 0700, files 0600)."""
        return self.directory / f"psi-mailbox-{_safe(release_id)}"

    def drop_psi_mailbox(self, release_id: str) -> None:
        """Delete the PSI mailbox kept for ``release_id`` (if any; a link there is removed, never
        followed)."""
        path = self.psi_mailbox_dir(release_id)
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        elif path.exists():
            shutil.rmtree(path, ignore_errors=True)

    def set_retention(self, record: ReleaseRecord, until: float) -> ReleaseRecord:
        """Record when key service ends (kept if already set)."""
        if record.retention_until is not None:
            return record
        record = replace(record, retention_until=until)
        self.save_record(record)
        return record

    # ------------------------------------------------------------ stored tables
    def save_table(self, record: TableRecord) -> None:
        """Persist a table record (0600, fsync) - before the first chunk is uploaded."""
        atomic_write(self._path("table", record.table_id), json.dumps(record.to_dict()).encode())

    def load_table(self, table_id: str) -> TableRecord | None:
        """The record of stored table ``table_id`` (None if this curator never stored it)."""
        data = self._load(self._path("table", table_id))
        if data is None:
            return None
        try:
            return TableRecord.from_dict(data)
        except (KeyError, ValueError, TypeError, SecureReleaseError) as exc:
            raise KeystoreError(f"table record of {table_id!r} is malformed ({type(exc).__name__})") from exc

    def drop_table(self, table_id: str) -> None:
        """Forget a stored table's key (after the server deleted the table)."""
        self._path("table", table_id).unlink(missing_ok=True)

    # ------------------------------------------------------------ the leader's agreement
    def _tag_path(self, kind: str, release_id: str) -> Path:
        return self.directory / f"agreement-{_safe(release_id)}.{kind}.tags"

    def save_agreement(
        self,
        agreement: VariantAgreement,
        tag_digests: dict[str, str],
        own_tags: TagArray | None = None,
        rows: dict[str, npt.NDArray[np.int64]] | None = None,
    ) -> None:
        """Persist the agreement before any follower is served it: each curator's rows in the
        canonical order as uint32 in ``agreement-<id>.rows-<curator>.tags`` (what a restarted
        leader serves and prepares from; without them, the common tags as raw 16-byte records
        in ``.common.tags``), with PSI the leader's own tags in ``.own.tags``, written first,
        and the JSON naming their SHA-256 last (a crash in between leaves no agreement)."""
        release_id = agreement.base.spec.release_id
        files: dict[str, str] = {}
        every_row_order = rows is not None and set(agreement.base.spec.curators) <= set(rows)
        common = None if every_row_order else agreement.base.common  # 160 MB at 10^7 ids, not needed
        arrays: list[tuple[str, Any]] = [("common", common), ("own", own_tags)]
        arrays += [(f"rows-{c}", r.astype("<u4")) for c, r in (rows or {}).items()]
        for kind, values in arrays:
            if values is not None:
                raw = np.ascontiguousarray(values).view(np.uint8).data  # a memoryview: no copy
                atomic_write(self._tag_path(kind, release_id), raw)
                files[kind] = hashlib.sha256(raw).hexdigest()
        data = agreement_to_dict(agreement, tag_digests, files)
        atomic_write(self._path("agreement", release_id), json.dumps(data).encode())

    def _load_raw(self, data: dict[str, Any], kind: str, release_id: str) -> bytes | None:
        """The bytes of file ``kind`` the agreement names, checked against its SHA-256."""
        digest = data["tag_files"].get(kind)
        if digest is None:
            return None
        raw = read_nofollow(self._tag_path(kind, release_id))
        if hashlib.sha256(raw).hexdigest() != digest:
            raise ValueError(f"the {kind} file does not match the agreement's digest")
        return raw

    def _load_tags(self, data: dict[str, Any], kind: str, release_id: str) -> TagArray | None:
        raw = self._load_raw(data, kind, release_id)
        return None if raw is None else tags_from_bytes(raw)

    def _load_rows(self, data: dict[str, Any], release_id: str) -> dict[str, npt.NDArray[np.int64]]:
        rows = {}
        for kind in data["tag_files"]:
            if kind.startswith("rows-"):
                raw = self._load_raw(data, kind, release_id)
                assert raw is not None
                rows[kind.removeprefix("rows-")] = np.frombuffer(raw, dtype="<u4").astype(np.int64)
        return rows

    def load_agreement(self, release_id: str) -> StoredAgreement | None:
        """The stored agreement, tag digests and (PSI) own tags (None if none was fixed)."""
        data = self._load(self._path("agreement", release_id))
        if data is None:
            return None
        try:
            spec = ReleaseSpec.from_dict(data["spec"])
            rows = self._load_rows(data, release_id)
            common = self._load_tags(data, "common", release_id)
            if common is None and not set(spec.curators) <= set(rows):
                raise KeyError("common")
            common = np.zeros(0, dtype=TAG_DTYPE) if common is None else common
            base = Agreement(spec, Seed(bytes.fromhex(data["seed"])), common)
            packed = data.get("packed_indices")
            agreement = VariantAgreement(
                base,
                SamplingMode.parse(str(data.get("sampling", "seed"))),
                AlignmentMode.parse(str(data.get("alignment", "keyed-hash"))),
                None if packed is None else base64.b64decode(packed),
            )
            return StoredAgreement(
                agreement,
                {str(k): str(v) for k, v in data["tag_digests"].items()},
                self._load_tags(data, "own", release_id),
                rows,
            )
        except (KeyError, ValueError, TypeError, OSError, SecureReleaseError) as exc:
            raise KeystoreError(f"agreement of {release_id!r} is malformed ({type(exc).__name__})") from exc
