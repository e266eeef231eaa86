# tier: unit
"""Issue 23, item 6: the ledger's reused-sample check is order-insensitive.

A sample is a set of stored positions; the order the server lists them in carries no privacy.
Re-serving a sample in another order used to pass the reuse check (the ledger compared the
SHA-256 of the packed *ordered* tuple) and measured a loss of 2.587 against a charge of 2.0. Here
the server re-serves the same positions reordered, through the same chunks a curator reads
(``sample_from_chunks``), and the curator's ledger refuses it (``SeedReuseError``)."""

from __future__ import annotations

import numpy as np
import pytest

from secure_release.infra.streams import sample_chunks, sample_from_chunks
from secure_release.mechanism.errors import SeedReuseError
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.ledger import PrivacyLedger
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.architectures import VariantAgreement, leader_agree_variant, sample_fingerprint
from secure_release.mechanism.protocol.index_sharing import (
    indices_fingerprint,
    pack_indices,
    sample_set_fingerprint,
)
from secure_release.mechanism.protocol.server_sampling import charge_table_release
from secure_release.mechanism.protocol.spec import ReleaseSpec

N, M, TABLE, DATASET = 500, 40, "t1", "ab" * 32


def _spec(rid: str) -> ReleaseSpec:
    return ReleaseSpec(rid, ("alice", "bob"), CipherMode.CHACHA20, plan_release(N, (6, 4), 1.0, M), (), TABLE)


def _served(rid: str, positions: np.ndarray) -> str:
    spec = _spec(rid)
    sample = sample_from_chunks(sample_chunks(rid, TABLE, N, M, pack_indices(positions, N)), spec)
    assert np.array_equal(sample.positions, positions)
    return sample.fingerprint


def test_a_reordered_server_sample_is_refused_by_the_ledger() -> None:
    rng = np.random.default_rng(23)
    first = rng.choice(N, M, replace=False)
    reordered = rng.permutation(first)
    assert not np.array_equal(first, reordered)
    # the wire's integrity value is order-sensitive (what the ledger used to compare) ...
    assert indices_fingerprint(pack_indices(first, N)) != indices_fingerprint(pack_indices(reordered, N))
    ledger = PrivacyLedger()
    ledger.append(ledger.set_budget(DATASET, "adult", 10.0, 0.0))
    assert charge_table_release(ledger, TABLE, "r1", 1.0, _served("r1", first), 0.0, DATASET) is not None
    # ... the ledger's is not: the same positions in another order are the same sample
    with pytest.raises(SeedReuseError):
        charge_table_release(ledger, TABLE, "r2", 1.0, _served("r2", reordered), 0.0, DATASET)
    # a sample differing in one position is a new sample
    other = first.copy()
    other[0] = next(p for p in range(N) if p not in set(first.tolist()))
    assert charge_table_release(ledger, TABLE, "r3", 1.0, _served("r3", other), 0.0, DATASET) is not None


def test_index_shared_agreements_fingerprint_the_set() -> None:
    """Curator-sampled with ``--sampling indices``: the leader's tuple reordered is the same sample."""
    tags = np.zeros(N, dtype=[("hi", ">u8"), ("lo", ">u8")])
    tags["lo"] = np.arange(N, dtype=np.uint64)
    rng = np.random.default_rng(7)
    tuple_ = rng.choice(N, M, replace=False)

    def agreement(rid: str, positions: np.ndarray) -> VariantAgreement:
        return leader_agree_variant(rid, ("alice", "bob"), {"alice": tags, "bob": tags}, {"alice": 6, "bob": 4},
                                    1.0, M, CipherMode.CHACHA20, "indices", indices=positions)  # fmt: skip

    a, b = agreement("r1", tuple_), agreement("r2", tuple_[::-1].copy())
    assert a.packed_indices != b.packed_indices
    assert sample_fingerprint(a) == sample_fingerprint(b) == sample_set_fingerprint(tuple_)
    ledger = PrivacyLedger()
    ledger.append(ledger.set_budget(DATASET, "adult", 10.0, 0.0))
    entry = ledger.reserve(DATASET, "adult", "r1", 1.0, sample_fingerprint(a), 0.0)
    assert entry is not None
    ledger.append(entry)
    with pytest.raises(SeedReuseError):
        ledger.reserve(DATASET, "adult", "r2", 1.0, sample_fingerprint(b), 0.0)
