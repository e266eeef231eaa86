"""Repeated ids found in the curator's own tag sort (``read_table(check_repeats=False)`` +
``has_repeated_tag`` + ``raise_repeats``) report exactly what the reader's own check reports,
and the reader's piecewise id checks equal the whole-array ones."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from secure_release.curator import columnar as columnar_module
from secure_release.curator.release.aligning import hashed_tags
from secure_release.curator.table import BadRowsError, load_schema, raise_repeats, read_table
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, SortedTags, has_repeated_tag, id_tags, sort_tags
from secure_release.mechanism.primitives.keys import AlignmentKey

KEY = AlignmentKey(bytes(range(32)))
SCHEMA = {"curator": "alice", "id_column": "id",
          "attributes": [{"name": "edu", "categories": ["a", "b"]}, {"name": "mar", "categories": ["m", "s"]}]}


def _spec(tmp: Path):  # type: ignore[no-untyped-def]
    (tmp / "s.json").write_text(json.dumps(SCHEMA))
    return load_schema(tmp / "s.json")


def _tags(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    tags = np.zeros(hi.size, dtype=TAG_DTYPE)
    tags["hi"], tags["lo"] = hi, lo
    return tags


def test_has_repeated_tag_is_exact_under_forced_prefix_ties() -> None:
    rng = np.random.default_rng(3)
    n = 50_000
    hi = rng.integers(0, 2**62, n, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    lo = rng.integers(0, 2**62, n, dtype=np.int64).astype(np.uint64)
    hi[1000:1500] = hi[:500] ^ np.uint64(1)  # 500 prefix ties with different tags: no repeat
    lo[1000:1500] = lo[:500]
    tags = _tags(hi, lo)
    assert len(set(zip(hi.tolist(), lo.tolist(), strict=True))) == n
    assert not has_repeated_tag(sort_tags(tags))
    for at in (7, 1200, n - 1):  # a repeat outside the ties, inside them, at the end
        copy = tags.copy()
        copy[at] = copy[(at * 31 + 5) % n]
        assert has_repeated_tag(sort_tags(copy))
    assert not has_repeated_tag(sort_tags(tags[:1])) and not has_repeated_tag(sort_tags(tags[:0]))
    # a list too long for packs (no packs): the exact path
    assert not has_repeated_tag(SortedTags(tags, 40, np.zeros(0, dtype=np.int64)))
    assert has_repeated_tag(SortedTags(np.concatenate([tags, tags[:1]]), 40, np.zeros(0, dtype=np.int64)))


def _write(tmp: Path, ids: list[str], edu: list[str]) -> Path:
    path = tmp / "d.csv"
    pacsv.write_csv(pa.table({"id": ids, "edu": edu, "mar": ["m"] * len(ids)}), path)
    return path


def test_deferred_repeats_report_what_the_reader_reports(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    ids = [f"p{i}" for i in range(2000)]
    ids[1500], ids[1999] = ids[3], ids[3]
    path = _write(tmp_path, ids, ["a"] * 2000)
    with pytest.raises(BadRowsError) as full:
        read_table(path, spec)
    assert [line for line, _ in full.value.problems] == [1502, 2001]
    table = read_table(path, spec, check_repeats=False)  # nothing else is bad: no repeat check
    assert has_repeated_tag(sort_tags(id_tags(table.id_values(), KEY)))
    with pytest.raises(BadRowsError) as deferred:
        raise_repeats(path, table)
    assert deferred.value.problems == full.value.problems
    config = SimpleNamespace(alignment_key=KEY, data=path, query=None)
    with pytest.raises(BadRowsError) as hashed:
        hashed_tags(config, table)  # type: ignore[arg-type]
    assert hashed.value.problems == full.value.problems
    # with another bad row the deferred reader still lists the repeats: the report is complete
    edu = ["a"] * 2000
    edu[10] = "zz"
    path = _write(tmp_path, ids, edu)
    with pytest.raises(BadRowsError) as mixed:
        read_table(path, spec, check_repeats=False)
    assert [line for line, _ in mixed.value.problems] == [12, 1502, 2001]


def test_hashed_tags_without_repeats_drop_the_ids_and_sort(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    ids = [f"p{i}" for i in range(500)]
    path = _write(tmp_path, ids, ["a", "b"] * 250)
    table = read_table(path, spec, check_repeats=False)
    config = SimpleNamespace(alignment_key=KEY, data=path, query=None)
    slim, sorted_tags = hashed_tags(config, table)  # type: ignore[arg-type]
    assert np.array_equal(sorted_tags.tags, id_tags(np.array(ids), KEY))
    assert slim.num_rows == 500 and len(slim.id_values()) == 0
    assert np.array_equal(slim.symbols(), table.symbols())


@pytest.mark.parametrize("piece", [1, 2, 3, 7])
def test_piecewise_id_checks_equal_whole_array_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    piece: int) -> None:
    spec = _spec(tmp_path)
    ids = [f"p{i}" for i in range(40)]
    ids[5], ids[17], ids[30] = "", " p17", "x" * 300  # missing, needs a trim, too long
    ids[33] = ids[9]
    edu = ["a", "b"] * 20
    path = _write(tmp_path, ids, edu)
    with pytest.raises(BadRowsError) as whole:
        read_table(path, spec)
    monkeypatch.setattr(columnar_module, "_PIECE", piece)
    with pytest.raises(BadRowsError) as pieces:
        read_table(path, spec)
    assert pieces.value.problems == whole.value.problems
    assert [line for line, _ in whole.value.problems] == [7, 32, 35]
    ids[5], ids[30], ids[33] = "p5", "p30", "p33"  # only the trim left: read, trimmed
    path = _write(tmp_path, ids, edu)
    assert read_table(path, spec).ids.tolist()[17] == "p17"
    monkeypatch.setattr(columnar_module, "_PIECE", 1 << 20)
    assert read_table(path, spec).ids.tolist()[17] == "p17"
