"""Seeds and keys: redacted repr, no pickling, domain-separated derivation."""

from __future__ import annotations

import copy
import pickle

import pytest

from secure_release.mechanism.errors import InvalidSeedError
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed, derive_bytes

KINDS = [Seed, PadKey, PramKey, AlignmentKey]
RAWS = [bytes(range(32)), bytes(32), bytes([0xAB]) * 32, bytes(range(100, 132))]


@pytest.mark.parametrize("cls", KINDS)
@pytest.mark.parametrize("raw", RAWS)
def test_repr_never_shows_secret(cls: type[Seed], raw: bytes) -> None:
    s = cls(raw)
    for text in (repr(s), str(s), f"{s}", f"{s!r}", repr([s]), repr({"k": s})):
        assert raw.hex() not in text.lower()
        assert raw.hex().upper() not in text
        assert repr(raw) not in text
        # no 8-byte window of the secret in hex either
        for i in range(0, 32 - 8 + 1, 4):
            assert raw[i : i + 8].hex() not in text.lower()
    assert "redacted" in repr(s)
    assert s.reveal() == raw


@pytest.mark.parametrize("cls", KINDS)
def test_not_picklable(cls: type[Seed]) -> None:
    s = cls.generate()
    with pytest.raises(TypeError):
        pickle.dumps(s)
    with pytest.raises(TypeError):
        copy.deepcopy(s)


@pytest.mark.parametrize("cls", KINDS)
@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), "x" * 32, 12345, None])
def test_wrong_length_or_type(cls: type[Seed], bad: object) -> None:
    with pytest.raises(InvalidSeedError):
        cls(bad)  # type: ignore[arg-type]


def test_from_hex() -> None:
    raw = bytes(range(32))
    assert Seed.from_hex(raw.hex()).reveal() == raw
    with pytest.raises(InvalidSeedError):
        Seed.from_hex("zz" * 32)
    with pytest.raises(InvalidSeedError):
        Seed.from_hex("00" * 31)


def test_derive_domain_separated() -> None:
    s = Seed(bytes(range(32)))
    outs = {
        s.derive("sampling", ""),
        s.derive("sampling", "r1"),
        s.derive("sampling", "r2"),
        s.derive("pad", ""),
        s.derive("pad", "r1"),
        s.derive("pram", "r1"),
        Seed(bytes(32)).derive("sampling", ""),
        # the separator prevents purpose/release confusion
        s.derive("a", "bc"),
        s.derive("ab", "c"),
    }
    assert len(outs) == 9
    assert all(len(o) == 32 for o in outs)
    assert s.derive("sampling", "r1") == Seed(bytes(range(32))).derive("sampling", "r1")
    assert len(s.derive("x", length=16)) == 16
    assert s.derive("x", length=16) == s.derive("x")[:16]  # HKDF prefix property
    assert s.derive("sampling") != s.reveal()
    with pytest.raises(InvalidSeedError):
        derive_bytes(bytes(32), "a|b")


def test_equality_and_generate() -> None:
    assert Seed(bytes(32)) == Seed(bytes(32))
    assert Seed(bytes(32)) != PadKey(bytes(32))
    assert Seed.generate() != Seed.generate()
    assert Seed(bytes(32)).fingerprint == Seed(bytes(32)).fingerprint
    assert Seed(bytes(32)).fingerprint != Seed(bytes(range(32))).fingerprint
