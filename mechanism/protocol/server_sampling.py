"""Server-side sampling from a stored encrypted table (Sec. V-B: "encrypt the full database with a
stream cipher, and request that the server perform both sampling and PRAM").

Storage, once per table: each curator encrypts its whole aligned column (canonical order: the
ascending keyed tag or PSI tag, a pseudorandom permutation of the individuals that only the
curators can compute) under a ChaCha20 pad of a :class:`TableKey`, seekable by row position:
c_p = (x_p + v_p) mod k_j with v = :func:`mechanism.primitives.pads.chacha20_pad` under
HKDF(table key, "stored-table", table id). It uploads c once (:func:`curator_store_table`).

Each release: the server draws a fresh sample from its own randomness
(:func:`server_draw_sample`: the seed rule of :mod:`mechanism.primitives.sampling` under a fresh server
seed, a uniform ordered m-tuple of stored positions), gathers those rows (:func:`server_gather`)
and, after one of the two key paths below, applies PRAM once (``protocol.server_perturb``).

Two key paths (:class:`KeyPath`):

- ``rekeyed`` (default): the server sends the positions to the curators; each curator returns a
  re-key column delta_i = (w_i - v_{p_i}) mod k_j for a fresh per-release pad w
  (:func:`curator_rekey`); the server adds it (:func:`server_apply_rekey`), so the sampled rows
  become x + w, encrypted under a per-release key exactly as in the seed variant. The researcher
  gets only the per-release key and never any position. Every release needs every curator, so
  each curator charges its own ledger before it answers. The curators need their table keys, not
  their plaintext.
- ``positions`` (the literal design): the server sends the researcher the perturbed rows and
  their stored positions; the researcher holds the curators' table keys and decrypts row i with
  v_{p_i} (:func:`researcher_decrypt_stored`). One release is exactly epsilon-DP (the positions
  are independent of which individuals were sampled, because the stored order is a secret
  uniform permutation). But the table key is long-lived and positions repeat across releases:
  the researcher learns which rows two releases share, which costs more than epsilon_1 +
  epsilon_2 for some overlaps (:func:`overlap_likelihood_ratio` is the exact ratio for K = 2
  only; for K >= 3 it is exceeded even below the mean overlap, and no bound is proved), and the
  curators can no longer refuse a release themselves (the server must enforce the ledger). Not
  public: ``variants.run_server_sampled_release`` refuses it (issue 23).

Budget: every release from a stored table is charged to that table's ledger
(:func:`charge_table_release`; dataset name :func:`table_ledger_name`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.primitives.keys import PadKey, Secret, Seed
from secure_release.mechanism.primitives.pads import (
    PAD_BLOCK_SYMBOLS,
    CipherMode,
    ReleasePad,
    chacha20_pad,
    decrypt,
    encrypt,
    new_release_pad,
)
from secure_release.mechanism.primitives.sampling import check_sample_size, sample_positions
from secure_release.mechanism.privacy.ledger import LedgerEntry, PrivacyLedger
from secure_release.mechanism.protocol.spec import check_name
from secure_release.mechanism.schema import SymbolArray, check_symbols

IndexArray = npt.NDArray[np.int64]


class KeyPath(enum.StrEnum):
    """How the researcher gets the pads of the server-sampled rows (module doc)."""

    REKEYED = "rekeyed"
    POSITIONS = "positions"

    @classmethod
    def parse(cls, text: str) -> KeyPath:
        try:
            return cls(text.lower())
        except ValueError as exc:
            raise UnknownKeyPathError(f"unknown key path {text!r}; allowed: rekeyed, positions") from exc


class UnprovedBoundError(SecureReleaseError):
    """A privacy bound asked for outside the cases where it holds (issue 23: the positions-path
    overlap ratio is known only for K = 2)."""


class PositionsPathError(SecureReleaseError):
    """The positions key path is not public: its privacy across releases is not accounted."""


class UnknownKeyPathError(SecureReleaseError):
    """A key path other than ``rekeyed`` or ``positions``."""


class TableKey(Secret):
    """A curator's key for one stored table (its pad covers every stored row, once)."""

    kind = "table key"


def table_ledger_name(table_id: str) -> str:
    """The ledger dataset every release from stored table ``table_id`` is charged to."""
    return f"stored-table:{check_name(table_id, 'table id')}"


def table_pad_key(key: TableKey, table_id: str) -> PadKey:
    """The ChaCha20 pad key of one stored table: HKDF(table key, "stored-table", table id)."""
    return PadKey(key.derive("stored-table", check_name(table_id, "table id")))


def table_pads(key: TableKey, table_id: str, alphabet_size: int, positions: npt.ArrayLike) -> SymbolArray:
    """v_p for each stored position p (any order, repeats allowed): one pad block of
    :data:`PAD_BLOCK_SYMBOLS` is computed per distinct block touched, then gathered."""
    pos = np.asarray(positions, dtype=np.int64)
    if pos.ndim != 1:
        raise ShapeMismatchError("positions must be one-dimensional")
    out = np.empty(pos.size, dtype=np.uint32)
    if pos.size == 0:
        return out
    if int(pos.min()) < 0:
        raise ShapeMismatchError("positions must be >= 0")
    pad_key = table_pad_key(key, table_id)
    blocks = pos // PAD_BLOCK_SYMBOLS
    for block in np.unique(blocks).tolist():
        at = np.flatnonzero(blocks == block)
        pads = chacha20_pad(pad_key, alphabet_size, block * PAD_BLOCK_SYMBOLS, PAD_BLOCK_SYMBOLS)
        out[at] = pads[pos[at] - block * PAD_BLOCK_SYMBOLS]
    return out


def curator_store_table(
    aligned_symbols: npt.ArrayLike,
    alphabet_size: int,
    table_id: str,
    injected_key: TableKey | None = None,
) -> tuple[SymbolArray, TableKey]:
    """Encrypt the whole aligned column under a fresh table key: c_p = (x_p + v_p) mod k.

    A table key encrypts one table version only: a changed table needs a new table id or key
    (with a reused pad the server learns x - x' for every row). ``injected_key``: tests only.
    """
    x = check_symbols(aligned_symbols, alphabet_size)
    key = injected_key if injected_key is not None else TableKey.generate()
    pad = chacha20_pad(table_pad_key(key, table_id), alphabet_size, 0, x.size)
    return encrypt(x, pad, alphabet_size), key


def server_draw_sample(
    n: int, m: int, release_id: str, server_seed: Seed | None = None
) -> tuple[IndexArray, Seed]:
    """The server's fresh uniform ordered m-tuple of stored positions, and the seed it came from
    (the seed stays at the server; ``server_seed``: tests only). Same rule as the curators'
    seed variant (:func:`mechanism.primitives.sampling.sample_positions`), so with the same seed it gives
    the same positions."""
    check_sample_size(n, m)
    seed = server_seed if server_seed is not None else Seed.generate()
    return sample_positions(seed, n, m, release_id), seed


def server_gather(stored: Sequence[SymbolArray], positions: IndexArray) -> list[SymbolArray]:
    """The stored ciphertext rows at ``positions``, in sample order, for every curator."""
    lengths = {int(np.asarray(c).size) for c in stored}
    if len(lengths) != 1:
        raise ShapeMismatchError(f"stored columns differ in length: {sorted(lengths)}")
    n = lengths.pop()
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ShapeMismatchError(f"sample positions must lie in [0, {n})")
    return [np.asarray(c, dtype=np.uint32)[pos] for c in stored]


def curator_rekey(
    positions: IndexArray,
    key: TableKey,
    table_id: str,
    alphabet_size: int,
    cipher: CipherMode | str = CipherMode.CHACHA20,
    injected_key: PadKey | None = None,
) -> tuple[SymbolArray, ReleasePad]:
    """Rekeyed path, at a curator: delta_i = (w_i - v_{p_i}) mod k for a fresh release pad w.

    Returns the re-key column for the server and the release pad (whose key, or pad for otp,
    the researcher later gets). The pad never encrypts plaintext here; it is used once, through
    delta. ``injected_key``: tests only.
    """
    pos = np.asarray(positions, dtype=np.int64)
    pad = new_release_pad(cipher, alphabet_size, int(pos.size), injected_key)
    v = table_pads(key, table_id, alphabet_size, pos)
    return decrypt(pad.pad(), v, alphabet_size), pad


def server_apply_rekey(
    rows: Sequence[SymbolArray], deltas: Sequence[SymbolArray], alphabet_sizes: Sequence[int]
) -> list[SymbolArray]:
    """Rekeyed path, at the server: (x + v) + (w - v) = x + w, for every curator's column."""
    if not len(rows) == len(deltas) == len(alphabet_sizes):
        raise ShapeMismatchError("one re-key column per curator is needed")
    return [encrypt(c, d, int(k)) for c, d, k in zip(rows, deltas, alphabet_sizes, strict=True)]


def researcher_decrypt_stored(
    perturbed: Sequence[SymbolArray],
    positions: IndexArray,
    keys: Sequence[TableKey],
    table_id: str,
    alphabet_sizes: Sequence[int],
) -> list[SymbolArray]:
    """Positions path, at the researcher: x_hat_i = (c_bar_i - v_{p_i}) mod k per curator."""
    if not len(perturbed) == len(keys) == len(alphabet_sizes):
        raise ShapeMismatchError("one table key and alphabet per perturbed column is needed")
    return [
        decrypt(c, table_pads(key, table_id, int(k), positions), int(k))
        for c, key, k in zip(perturbed, keys, alphabet_sizes, strict=True)
    ]


def charge_table_release(
    ledger: PrivacyLedger,
    table_id: str,
    release_id: str,
    epsilon: float,
    sample_fingerprint: str,
    now: float = 0.0,
    dataset: str | None = None,
    table: str = "",
) -> LedgerEntry | None:
    """Reserve one release from a stored table on the ledger data set ``dataset`` (refuses a
    repeated release id or sample, or a release past the budget; records nothing then). The
    caller commits it when the server seals the release, or refunds it if the release aborts.

    ``dataset`` is the data set (the population) the table was stored from, so releases from
    the stored table and ordinary releases of the same data draw on one budget (the curators'
    services pass it, and ``table``, the SHA-256 of the data file, which is recorded); without it
    the table has a data set of its own, :func:`table_ledger_name` (the in-memory simulation)."""
    name = table_ledger_name(table_id) if dataset is None else dataset
    entry = ledger.reserve(name, table_id, release_id, epsilon, sample_fingerprint, now, table=table)
    if entry is not None:
        ledger.append(entry)
    return entry


def overlap_likelihood_ratio(
    n: int, m1: int, gamma1: float, m2: int, gamma2: float, overlap: int, joint_size: int
) -> Fraction:
    """Positions path, two releases from one stored table, **binary joint alphabet only**
    (``joint_size`` K = 2; any other K raises :class:`UnprovedBoundError`): the largest
    likelihood ratio given that the researcher sees that the two samples share ``overlap`` rows
    (exact rationals):

        1 + (m1/n)(g1 - 1) + (m2/n)(g2 - 1) + (overlap/n)(g1 - 1)(g2 - 1).

    At K = 2 it equals the exact enumeration in every case tested (n = 3, every overlap;
    tests/unit/test_mech_variants_privacy_exact.py and tests/unit/test_claims_overlap.py); it agrees with the
    composed (1 + (m1/n)(g1 - 1))(1 + (m2/n)(g2 - 1)) when overlap = m1 m2 / n and exceeds it
    above. It is not a bound for K >= 3, and none is proved here: by exact enumeration the worst
    ratio is 127/7 against the formula's 35/3 (n = 3, m = (2, 2), gamma = 5, K = 3, overlap 1,
    which is *below* the mean 4/3 and still above the composed 121/9) and 53/9 against 17/3
    (n = 3, m = (2, 1), gamma = (4, 3), K = 4, overlap 1). That is why the positions path is not
    public (``variants.run_server_sampled_release`` refuses it; the services refuse it too).
    """
    if joint_size != 2:
        raise UnprovedBoundError(
            f"overlap_likelihood_ratio holds for a binary joint alphabet only (K = 2), got K = {joint_size}: for "
            "K >= 3 exact enumeration exceeds it (127/7 > 35/3 at n = 3, m = (2, 2), gamma = 5, K = 3, overlap 1)"
        )
    check_sample_size(n, m1)
    check_sample_size(n, m2)
    if not max(0, m1 + m2 - n) <= overlap <= min(m1, m2):
        raise ShapeMismatchError(f"overlap {overlap} impossible for m1 = {m1}, m2 = {m2}, n = {n}")
    g1, g2 = Fraction(gamma1), Fraction(gamma2)
    return 1 + Fraction(m1, n) * (g1 - 1) + Fraction(m2, n) * (g2 - 1) + Fraction(overlap, n) * (g1 - 1) * (g2 - 1)
