"""The keystore's on-disk formats: compact symbols, binary agreement tag files with digests."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import numpy as np
import pytest
from support import make_spec

from secure_release.curator.records.keystore import Keystore, KeystoreError, ReleaseRecord
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE
from secure_release.mechanism.primitives.keys import PadKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode, new_release_pad
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, VariantAgreement
from secure_release.mechanism.protocol.in_memory import Agreement


def _record(k: int, mode: CipherMode) -> ReleaseRecord:
    spec = make_spec()
    sample = ((np.arange(spec.m, dtype=np.int64) * 7919) % k).astype(np.uint32)
    pad = new_release_pad(mode, k, spec.m, PadKey(bytes(range(32))) if mode is CipherMode.CHACHA20 else None)
    return ReleaseRecord(spec, pad, sample, "f" * 64, "d", "s")


@pytest.mark.parametrize("k,width", [(6, 1), (256, 1), (257, 2), (70_000, 4)])
@pytest.mark.parametrize("mode", [CipherMode.OTP, CipherMode.CHACHA20])
def test_a_record_stores_each_symbol_in_the_narrowest_width(
    tmp_path: Path, k: int, width: int, mode: CipherMode
) -> None:
    keystore = Keystore(tmp_path / "ks")
    record = _record(k, mode)
    keystore.save_record(record)
    data = json.loads((tmp_path / "ks" / f"release-{record.spec.release_id}.json").read_text())
    assert data["symbol_width"] == width and len(base64.b64decode(data["sample"])) == record.spec.m * width
    back = keystore.load_record(record.spec.release_id)
    assert back is not None and np.array_equal(back.sample, record.sample)
    assert np.array_equal(back.ciphertext(), record.ciphertext())


def test_a_record_of_the_older_four_byte_format_still_loads(tmp_path: Path) -> None:
    keystore = Keystore(tmp_path / "ks")
    record = _record(6, CipherMode.OTP)
    data = record.to_dict()
    del data["symbol_width"]
    assert record.pad.pad_symbols is not None
    data["sample"] = base64.b64encode(record.sample.astype("<u4").tobytes()).decode()
    data["otp_pad"] = base64.b64encode(record.pad.pad_symbols.astype("<u4").tobytes()).decode()
    (tmp_path / "ks" / f"release-{record.spec.release_id}.json").write_text(json.dumps(data))
    back = keystore.load_record(record.spec.release_id)
    assert back is not None and np.array_equal(back.ciphertext(), record.ciphertext())


def _agreement() -> tuple[VariantAgreement, np.ndarray]:
    rng = np.random.default_rng(3)
    common = np.zeros(1000, dtype=TAG_DTYPE)
    common["hi"], common["lo"] = np.sort(rng.integers(0, 2**63, 1000)), rng.integers(0, 2**63, 1000)
    own = common[::2].copy()
    base = Agreement(make_spec(), Seed(bytes(range(32))), common)
    return VariantAgreement(base, SamplingMode.SEED, AlignmentMode.PSI), own


def test_the_agreement_keeps_its_tags_in_binary_files_named_by_digest(tmp_path: Path) -> None:
    keystore = Keystore(tmp_path / "ks")
    agreement, own = _agreement()
    keystore.save_agreement(agreement, {"alice": "a" * 64}, own)
    rid = agreement.base.spec.release_id
    common_file = tmp_path / "ks" / f"agreement-{rid}.common.tags"
    assert common_file.stat().st_size == 16 * 1000  # raw records, not base64 in JSON
    assert stat.S_IMODE(common_file.stat().st_mode) == 0o600
    stored = keystore.load_agreement(rid)
    assert stored is not None and stored.own_tags is not None
    assert np.array_equal(stored.agreement.base.common, agreement.base.common)
    assert np.array_equal(stored.own_tags, own) and stored.digests == {"alice": "a" * 64}
    assert stored.agreement.alignment is AlignmentMode.PSI


def test_a_tampered_or_missing_tag_file_is_refused(tmp_path: Path) -> None:
    keystore = Keystore(tmp_path / "ks")
    agreement, _ = _agreement()
    keystore.save_agreement(agreement, {})
    rid = agreement.base.spec.release_id
    common_file = tmp_path / "ks" / f"agreement-{rid}.common.tags"
    raw = bytearray(common_file.read_bytes())
    raw[5] ^= 1
    common_file.write_bytes(bytes(raw))
    with pytest.raises(KeystoreError, match="malformed"):
        keystore.load_agreement(rid)
    common_file.unlink()
    with pytest.raises(KeystoreError, match="malformed"):
        keystore.load_agreement(rid)


def test_a_stored_tables_budget_is_its_data_files(tmp_path: Path) -> None:
    """``budget set --table-id`` before the table is stored is refused (exit 2, saying to use
    --data): a stored table shares its data file's budget, so storing never doubles it."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, "-m", "secure_release.curator", "budget", "set", "--keystore", str(tmp_path / "ks"),
           "--table-id", "t9", "--epsilon", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert "stored no table 't9'" in done.stderr and "--data" in done.stderr


def test_the_agreement_keeps_every_curators_row_order(tmp_path: Path) -> None:
    keystore = Keystore(tmp_path / "ks")
    agreement, _ = _agreement()
    rows = {"bob": np.arange(999, -1, -1, dtype=np.int64), "carol": np.arange(1000, dtype=np.int64) * 3}
    keystore.save_agreement(agreement, {}, None, rows)
    rid = agreement.base.spec.release_id
    rows_file = tmp_path / "ks" / f"agreement-{rid}.rows-bob.tags"
    assert rows_file.stat().st_size == 4 * 1000  # uint32 a row
    stored = keystore.load_agreement(rid)
    assert stored is not None and set(stored.rows) == {"bob", "carol"}
    assert all(np.array_equal(stored.rows[c], rows[c]) for c in rows)
    rows_file.write_bytes(b"\x00\x00\x00\x00" + rows_file.read_bytes()[4:])  # row 999 -> 0
    with pytest.raises(KeystoreError, match="malformed"):
        keystore.load_agreement(rid)


def test_with_every_curators_rows_the_common_tags_are_not_written(tmp_path: Path) -> None:
    keystore = Keystore(tmp_path / "ks")
    agreement, _ = _agreement()
    curators = agreement.base.spec.curators
    rows = {c: np.arange(1000, dtype=np.int64)[:: 1 if i % 2 else -1].copy() for i, c in enumerate(curators)}
    keystore.save_agreement(agreement, {}, None, rows)
    rid = agreement.base.spec.release_id
    assert not (tmp_path / "ks" / f"agreement-{rid}.common.tags").exists()  # 16 n bytes saved
    stored = keystore.load_agreement(rid)
    assert stored is not None and stored.agreement.base.common.size == 0
    assert all(np.array_equal(stored.rows[c], rows[c]) for c in curators)
    (tmp_path / "ks" / f"agreement-{rid}.rows-{curators[0]}.tags").unlink()
    with pytest.raises(KeystoreError, match="malformed"):
        keystore.load_agreement(rid)
