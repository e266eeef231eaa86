"""The PostgreSQL source without a server: the URL's checks (a password refused by name), the
default data set name, the rows' order-independent fingerprint, the slices' SQL, the runs the
stream is cut into, and the flags that name the source (the server tests:
tests/system/test_postgres_reader.py and test_postgres_release.py)."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from secure_release.curator.columnar import DataSourceError, RowSource, TableSpec, check_rows
from secure_release.curator.config import _password_file_settings
from secure_release.curator.partitions import dataset_name, require_data
from secure_release.curator.postgres import PasswordInUrlError, check_url, is_database_url, query_dataset_name
from secure_release.curator.postgres_read import RowDigest, _joined, _runs, columns_of, slice_query
from secure_release.frames import database_query
from secure_release.infra.config import ConfigError
from secure_release.mechanism.errors import InvalidNameError
from secure_release.mechanism.protocol.spec import check_name
from secure_release.mechanism.schema import CuratorSchema, attribute_from_dict

URL = "postgresql://office@db.example:5433/people"


def test_a_url_with_a_password_is_refused_by_name_without_echoing_it() -> None:
    for url in ("postgresql://office:s3cret-pw@db.example/people", "postgres://office:s3cret-pw@db.example/people",
                "postgresql://office@db.example/people?password=s3cret-pw",
                "postgresql://office@db.example/people?sslmode=require&sslpassword=s3cret-pw"):
        with pytest.raises(PasswordInUrlError, match="carries a password") as caught:
            check_url(url)
        assert "s3cret-pw" not in str(caught.value)


def test_a_url_names_a_host_and_a_database_and_survives_a_path() -> None:
    url = check_url(URL)
    assert (url.host, url.port, url.database, url.name) == ("db.example", 5433, "people",
                                                            "postgresql db.example:5433/people")
    assert check_url(Path(URL)).url == URL  # a Path folds "//": the reader unfolds it
    assert check_url("postgresql://office@db.example/people?sslmode=verify-full").port == 5432
    for bad in ("postgresql://db.example", "postgresql:///people"):
        with pytest.raises(DataSourceError, match="names a host and a database"):
            check_url(bad)
    assert is_database_url(URL) and is_database_url(Path(URL)) and not is_database_url("people.csv")
    with pytest.raises(DataSourceError, match="needs --query"):
        require_data(URL, "--data")


def test_the_default_data_set_name_is_the_database_and_the_digest_of_the_query() -> None:
    first = dataset_name(URL, "SELECT * FROM survey")
    assert first.startswith("people-") and len(first) == len("people-") + 12
    assert check_name(first, "--dataset") == first
    assert query_dataset_name(URL, "SELECT * FROM survey") == first
    assert dataset_name(URL, "SELECT *  FROM survey") != first  # any other text: another data set
    assert dataset_name("postgresql://office@other:5433/people", "SELECT * FROM survey") != first
    with pytest.raises(InvalidNameError):
        check_name("people digest", "--dataset")


def rows(n: int = 2_000, seed: int = 4) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": pa.array([f"p{i}" for i in range(n)]),
        "edu": pa.array(rng.choice(["a", "b", None], n)).dictionary_encode(),
        "age": pa.array(rng.integers(0, 90, n), pa.int32(), mask=rng.random(n) < 0.05),
        "score": pa.array(rng.normal(size=n)),
        "born": pa.array([datetime.date(1950, 1, 1) + datetime.timedelta(days=int(d))
                          for d in rng.integers(0, 9_000, n)]),
        "ok": pa.array(rng.random(n) < 0.5),
        "note": pa.array(rng.choice(["x", "y"], n)),
    })  # fmt: skip


def digest_of(*tables: pa.Table) -> str:
    digest = RowDigest(columns_of(tables[0].schema))
    for table in tables:
        digest.add(table)
    return digest.hexdigest()


def test_the_fingerprint_does_not_depend_on_the_order_or_the_runs_of_the_rows() -> None:
    table = rows()
    whole = digest_of(table)
    shuffled = table.take(pa.array(np.random.default_rng(1).permutation(table.num_rows)))
    assert digest_of(shuffled.slice(0, 700), shuffled.slice(700)) == whole
    parts = [RowDigest(columns_of(table.schema)) for _ in range(3)]
    for part, start in zip(parts, (0, 500, 1_500), strict=True):
        part.add(table.slice(start, {0: 500, 500: 1_000, 1_500: 500}[start]))
    parts[0].merge(parts[1])
    parts[0].merge(parts[2])
    assert parts[0].hexdigest() == whole  # a cluster's slices, merged


def test_the_fingerprint_changes_with_any_one_cell_a_row_or_a_column() -> None:
    table = rows()
    whole = digest_of(table)
    seen = {whole}
    for name in table.column_names:
        values = table.column(name).combine_chunks()
        if pa.types.is_dictionary(values.type):
            values = values.cast(values.type.value_type)
        python = values.to_pylist()
        python[17] = {"id": "p-other", "edu": "c", "age": None if python[17] is not None else 3,
                      "score": 0.5, "born": datetime.date(2001, 2, 3), "ok": not python[17], "note": "z"}[name]
        changed = table.set_column(table.schema.get_field_index(name), name, pa.array(python, values.type))
        seen.add(digest_of(changed))
    seen.add(digest_of(table.slice(1)))  # a row less
    seen.add(digest_of(table.drop_columns(["note"])))  # a column less
    seen.add(digest_of(table.rename_columns([*table.column_names[:-1], "remark"])))  # a column renamed
    assert len(seen) == 1 + len(table.column_names) + 3


def test_a_column_of_an_unreadable_type_is_named() -> None:
    table = pa.table({"id": ["a"], "tags": pa.array([[1, 2]], pa.list_(pa.int64()))})
    with pytest.raises(DataSourceError, match="column 'tags' of the query is of type list"):
        digest_of(table)


def test_slices_select_by_the_hash_of_the_id() -> None:
    assert slice_query("SELECT * FROM t;  ", "id", 0, 1) == "SELECT * FROM t"
    text = slice_query("SELECT * FROM t -- a comment", 'pid"x', 2, 5)
    assert text.endswith('(hashtext(secure_release_rows."pid""x"::text) & 2147483647) % 5 = 2')
    assert "-- a comment\n)" in text  # the query's trailing comment cannot swallow the slice's SQL


class _Reader:
    """A stand-in for ADBC's RecordBatchReader (batches, then perhaps an error)."""

    def __init__(self, batches: list[pa.RecordBatch], error: Exception | None = None) -> None:
        self.schema, self._batches, self._error = batches[0].schema, batches, error

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self._batches
        if self._error is not None:
            raise self._error


def test_the_stream_is_cut_into_runs_and_an_error_midway_is_named() -> None:
    batches = rows(1_000).to_batches(max_chunksize=90)
    got = list(_runs(_Reader(batches), check_url(URL), rows=400))
    assert [t.num_rows for t in got] == [450, 450, 100]
    assert pa.concat_tables(got).equals(pa.Table.from_batches(batches))
    with pytest.raises(DataSourceError, match=r"the query failed .*server closed the connection"):
        list(_runs(_Reader(batches, RuntimeError("server closed the connection")), check_url(URL), rows=400))


def test_runs_joined_keep_every_bad_row_at_its_row_in_the_result() -> None:
    spec = TableSpec(CuratorSchema("a", (attribute_from_dict({"name": "note", "categories": ["x"]}),)), "id")
    table = rows(300)
    source = RowSource(Path("postgresql db"), False)
    parts = [check_rows(table.column_names, table.slice(s, 100), spec, source, None) for s in (0, 100, 200)]
    joined = _joined(parts, source, len(table.column_names))
    expected = np.flatnonzero(np.asarray(table.column("note").to_pylist()) != "x")
    assert sorted(joined.problems.reasons) == expected.tolist() and len(joined.ids) == 300


def test_the_password_file_flag_needs_a_database_and_a_file(tmp_path: Path) -> None:
    args = argparse.Namespace(data="people.csv", data_password_file=str(tmp_path / "pw"), query=None)
    with pytest.raises(ConfigError, match="password of a --data postgresql:// database"):
        _password_file_settings(args)
    args.data = URL
    with pytest.raises(Exception, match="pw"):
        _password_file_settings(args)  # no such file: named
    with pytest.raises(PasswordInUrlError):
        database_query("postgresql://u:pw@h/db", "SELECT 1")


def test_a_password_file_others_may_read_is_refused_by_name(tmp_path: Path) -> None:
    from secure_release.curator.columnar import DataSourceError
    from secure_release.curator.postgres import _read_password

    path = tmp_path / "pw"
    path.write_text("s3cret-pw\n")
    path.chmod(0o644)
    with pytest.raises(DataSourceError, match=r"mode is 644.*chmod 600") as caught:
        _read_password(path)
    assert "s3cret-pw" not in str(caught.value)
    path.chmod(0o600)
    assert _read_password(path) == "s3cret-pw"
