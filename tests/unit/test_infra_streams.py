"""Every chunked stream of infra.streams: what the encoder sends, the decoder gives back
(several messages where the payload passes 1 MiB), and one bad stream each decoder refuses."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
from support import make_spec

from secure_release.infra import streams as st
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE
from secure_release.mechanism.primitives.keys import PadKey, Seed
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols, unpack_symbols
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, VariantAgreement
from secure_release.mechanism.protocol.in_memory import Agreement
from secure_release.mechanism.protocol.index_sharing import pack_indices
from secure_release.mechanism.schema import Attribute, CuratorSchema

RNG = np.random.default_rng(20261125)


def _tags(count: int) -> np.ndarray:
    return np.sort(RNG.integers(0, 2**63, size=(count, 2), dtype=np.uint64).view(TAG_DTYPE).reshape(-1))


def test_tags_round_trip_over_several_messages() -> None:
    tags = _tags(st.TAGS_PER_CHUNK + 5)
    msgs = list(st.tag_chunks("r1", "bob", tags, 12, AlignmentMode.PSI))
    assert len(msgs) == 2 and msgs[-1].last and all(len(m.tags) <= 1 << 20 for m in msgs)
    got = st.read_tag_stream(iter(msgs), "bob", lambda rid: 10 * len(tags) * st.TAG_BYTES)
    assert (got.release_id, got.alphabet_size, got.alignment) == ("r1", 12, AlignmentMode.PSI)
    assert np.array_equal(got.tags, tags)
    with pytest.raises(st.CallerNotAllowedError):
        st.read_tag_stream(iter(msgs), "mallory", lambda rid: 1 << 30)
    with pytest.raises(st.TagLimitError):
        st.read_tag_stream(iter(msgs), "bob", lambda rid: st.TAG_BYTES)


def test_psi_points_round_trip_and_a_short_list_is_refused() -> None:
    points = RNG.bytes(st.POINT_BYTES * (st.POINTS_PER_CHUNK + 3))
    msgs = list(st.point_chunks("r1", "alice", "bob", 2, points))
    assert len(msgs) == 2 and msgs[0].count == len(points) // st.POINT_BYTES
    got = st.read_point_stream(iter(msgs), "alice")
    assert (got.release_id, got.owner, got.hop, got.points) == ("r1", "bob", 2, points)
    with pytest.raises(st.PsiStreamError):
        st.read_point_stream(iter(msgs[:1]), "alice")


@pytest.mark.parametrize("variant", ["seed+tags", "seed+rows", "indices+rows"])
def test_the_agreement_round_trips(variant: str) -> None:
    spec = make_spec(m=1000, n=5000)
    common = _tags(spec.n)
    rows = RNG.permutation(spec.n).astype(np.int64)
    if variant.startswith("seed"):
        agreement = VariantAgreement(Agreement(spec, Seed.generate(), common), SamplingMode.SEED,
                                     AlignmentMode.KEYED_HASH)  # fmt: skip
    else:
        packed = pack_indices(RNG.choice(spec.n, spec.m, replace=False), spec.n)
        agreement = VariantAgreement(Agreement(spec, Seed.generate(), common), SamplingMode.INDICES,
                                     AlignmentMode.KEYED_HASH, packed)  # fmt: skip
    send_rows = rows if variant.endswith("rows") else None
    got = st.agreement_from_chunks(st.agreement_chunks(agreement, send_rows))
    assert got.base.spec == spec and got.sampling is agreement.sampling
    if send_rows is None:
        assert np.array_equal(got.base.common, common) and got.base.seed.reveal() == agreement.base.seed.reveal()
    else:
        assert got.own_rows is not None and np.array_equal(got.own_rows, rows)
    assert got.packed_indices == agreement.packed_indices
    tampered = list(st.agreement_chunks(agreement, send_rows))
    tampered[0].sequence = 1
    with pytest.raises(st.AgreementError):
        st.agreement_from_chunks(iter(tampered))


def test_an_upload_round_trips_and_a_wrong_digest_is_refused() -> None:
    chunks = [RNG.bytes(CHUNK_ROWS) for _ in range(3)]
    msgs = list(st.upload_chunks("r1", "alice", chunks))
    got = st.upload_from_chunks(msgs)
    assert [got.chunks[i] for i in range(3)] == chunks and got.num_chunks == 3
    resumed = list(st.upload_chunks("r1", "alice", chunks, skip=frozenset({0, 2})))
    assert [m.sequence for m in resumed if not m.commit] == [1]
    msgs[-1].digest = hashlib.sha256(b"x").digest()
    with pytest.raises(st.UploadStreamError):
        st.upload_from_chunks(msgs)


def test_a_stored_table_declaration_round_trips() -> None:
    declared = st.TableDeclaration("t1", "alice", ("alice", "bob"), 5000, 12)
    chunks = [RNG.bytes(100), RNG.bytes(50)]
    msgs = list(st.table_chunks(declared, chunks))
    assert st.table_declaration_from_pb(msgs[0]) == declared
    assert [m.symbols for m in msgs[:-1]] == chunks and msgs[-1].commit and msgs[-1].num_chunks == 2
    assert st.table_num_chunks(CHUNK_ROWS + 1) == 2
    msgs[0].n = 0
    with pytest.raises(st.ShapeMismatchError):
        st.table_declaration_from_pb(msgs[0])


def test_the_servers_sample_round_trips() -> None:
    spec = dataclasses.replace(make_spec(m=500_000, n=2_000_000), table_id="t1")
    positions = RNG.choice(spec.n, spec.m, replace=False)
    packed = pack_indices(positions, spec.n)
    msgs = list(st.sample_chunks(spec.release_id, "t1", spec.n, spec.m, packed))
    assert len(msgs) > 1
    got = st.sample_from_chunks(iter(msgs), spec)
    assert np.array_equal(got.positions, positions) and got.packed == packed
    msgs[-1].sample_fingerprint = "0" * 64
    with pytest.raises(st.SampleStreamError):
        st.sample_from_chunks(iter(msgs), spec)


def test_perturbed_rows_round_trip_with_their_digest() -> None:
    spec = make_spec(m=2 * CHUNK_ROWS + 7)
    cols = [RNG.integers(0, k, spec.m).astype(np.uint32) for k in spec.plan.alphabet_sizes]
    sizes = spec.plan.alphabet_sizes
    parts = [
        (seq, start, [pack_symbols(c[start : start + CHUNK_ROWS], k) for c, k in zip(cols, sizes, strict=True)])
        for seq, start in enumerate(range(0, spec.m, CHUNK_ROWS))
    ]
    digest = hashlib.sha256(b"".join(b for _, _, cs in parts for b in cs)).digest()
    stream = st.perturbed_chunks(spec.release_id, parts, len(parts), digest)
    packed, computed, streamed = st.perturbed_from_chunks(stream, spec)
    assert computed == streamed == digest
    for raw, col, k in zip(packed, cols, spec.plan.alphabet_sizes, strict=True):
        assert np.array_equal(unpack_symbols(raw, k), col)
    with pytest.raises(st.FetchError):
        st.perturbed_from_chunks(st.perturbed_chunks(spec.release_id, parts[:1], len(parts), digest), spec)


@pytest.mark.parametrize("mode", [CipherMode.OTP, CipherMode.CHACHA20])
def test_a_curators_key_round_trips(mode: CipherMode) -> None:
    schema = CuratorSchema("alice", (Attribute("a", ("x", "y", "z")), Attribute("b", ("u", "v"))))
    m = CHUNK_ROWS + 3
    if mode is CipherMode.CHACHA20:
        pad = ReleasePad(mode, 6, m, key=PadKey.generate())
    else:
        pad = ReleasePad(mode, 6, m, pad_symbols=RNG.integers(0, 6, m).astype(np.uint32))
    got = st.key_from_chunks(st.key_chunks("r1", schema, pad))
    assert got is not None
    head, otp = got
    assert (head.release_id, head.curator, head.alphabet_size, head.m) == ("r1", "alice", 6, m)
    if mode is CipherMode.CHACHA20:
        assert pad.key is not None and head.chacha20_key == pad.key.reveal() and otp == b""
    else:
        assert np.array_equal(unpack_symbols(otp, 6), pad.pad())
    assert st.key_from_chunks(iter([])) is None
