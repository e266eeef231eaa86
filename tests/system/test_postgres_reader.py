"""The curator's PostgreSQL reader against a real server (tests/system/postgres_server.py): the
same codes as the same rows read from Parquet, one snapshot, an order-independent fingerprint,
bad rows named by their row in the result, and a named error (and exit code, nothing left
behind) for a missing column, a wrong type, an unreachable server, a refused password and a
password in the URL."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from postgres_server import PostgresServer, postgres_server
from support import child_env

from secure_release.cluster import free_port
from secure_release.curator.badrows import BadRowsError
from secure_release.curator.columnar import DataSourceError, TableSpec
from secure_release.curator.postgres import (
    DatabaseLoginError,
    DatabaseUnreachableError,
    PasswordInUrlError,
    check_url,
    held_snapshot,
    register_query,
    release_snapshots,
    set_password_file,
)
from secure_release.curator.postgres_read import query_fingerprint, query_partitions, read_slice
from secure_release.curator.table import load_schema, read_table
from secure_release.frames import database_query
from secure_release.mechanism.schema import CuratorSchema, attribute_from_dict

ROWS = 30_000
SPEC = TableSpec(CuratorSchema("alice", (
    attribute_from_dict({"name": "education", "categories": ["no college", "some college", "post-graduate"]}),
    attribute_from_dict({"name": "age", "bins": [0, 30, 60, 120]}),
)), "id")  # fmt: skip


def people(rows: int = ROWS, seed: int = 11) -> pa.Table:
    rng = np.random.default_rng(seed)
    education = np.array(["no college", "some college", "post-graduate"])[rng.integers(0, 3, rows)]
    return pa.table({
        "id": pa.array([f"p{i:07d}" for i in rng.permutation(rows)]),
        "education": pa.array(education),
        "age": pa.array(rng.integers(17, 95, rows).astype(np.int32)),
        "note": pa.array(rng.normal(size=rows)),
    })  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PostgresServer, Path]]:
    root = tmp_path_factory.mktemp("pg-reader")
    with postgres_server() as pg:
        pg.load("people", people())
        bad = people(200, seed=3).to_pydict()
        bad["education"][7], bad["id"][9], bad["age"][11] = "college?", "", None
        pg.load("bad_people", pa.table(bad))
        pg.execute("CREATE TABLE arrays AS SELECT id, ARRAY[age, age] AS education, age FROM people LIMIT 10")
        password = pg.role("reader", ["people", "bad_people", "arrays"])
        (root / "pw").write_text(password + "\n")
        (root / "pw").chmod(0o600)
        set_password_file(root / "pw")
        yield pg, root
        set_password_file(None)
        release_snapshots()


def test_the_codes_and_ids_are_those_of_the_same_rows_from_parquet(server: tuple[PostgresServer, Path],
                                                                    tmp_path: Path) -> None:
    pg, _ = server
    pq.write_table(people(), tmp_path / "people.parquet", row_group_size=7_000)
    from_file = read_table(tmp_path / "people.parquet", SPEC)
    from_db = read_table(pg.url("reader"), SPEC, query="SELECT id, education, age FROM people ORDER BY id DESC")
    order_file, order_db = np.argsort(from_file.ids), np.argsort(from_db.ids)
    assert from_db.num_rows == from_file.num_rows == ROWS
    assert np.array_equal(from_file.ids[order_file], from_db.ids[order_db])
    assert np.array_equal(from_file.encoded[order_file], from_db.encoded[order_db])


def test_the_fingerprint_is_of_the_rows_in_any_order_and_changes_with_any_cell(
    server: tuple[PostgresServer, Path],
) -> None:
    pg, _ = server
    url = pg.url("reader")
    ascending = read_table(url, SPEC, query="SELECT * FROM people ORDER BY id").fingerprint
    descending = read_table(url, SPEC, query="SELECT * FROM people ORDER BY id DESC").fingerprint
    assert ascending == descending and len(ascending) == 64
    assert query_fingerprint(url, "SELECT * FROM people ORDER BY age, id") == ascending
    one_cell = "SELECT id, education, age, CASE WHEN id = 'p0000005' THEN note + 1e-9 ELSE note END AS note FROM people"
    assert read_table(url, SPEC, query=one_cell).fingerprint != ascending
    fewer = read_table(url, SPEC, query="SELECT * FROM people WHERE id <> 'p0000005'").fingerprint
    assert fewer != ascending


def test_bad_rows_are_named_by_their_row_in_the_result(server: tuple[PostgresServer, Path]) -> None:
    pg, _ = server
    rows = pa.table(people(200, seed=3).to_pydict())
    with pytest.raises(BadRowsError) as caught:
        read_table(pg.url("reader"), SPEC, query="SELECT id, education, age FROM bad_people")
    lines = {line for line, _ in caught.value.problems}
    assert lines == {7 + 2, 9 + 2, 11 + 2}  # row index + 2: the header is line 1
    assert "postgresql 127.0.0.1" in str(caught.value) and "college?" not in caught.value.public_message
    assert rows.num_rows == 200


def test_a_missing_column_and_a_wrong_type_are_named(server: tuple[PostgresServer, Path]) -> None:
    pg, _ = server
    with pytest.raises(BadRowsError, match=r"missing column\(s\) \['age'\]"):
        read_table(pg.url("reader"), SPEC, query="SELECT id, education FROM people")
    with pytest.raises(DataSourceError, match="column 'education' of the query is of type list"):
        read_table(pg.url("reader"), SPEC, query="SELECT * FROM arrays")
    with pytest.raises(DataSourceError, match=r"the query failed .*nosuch"):
        read_table(pg.url("reader"), SPEC, query="SELECT nosuch FROM people")


def test_connection_errors_are_named(server: tuple[PostgresServer, Path], tmp_path: Path) -> None:
    pg, root = server
    with pytest.raises(DatabaseUnreachableError, match="cannot reach the database server"):
        read_table(f"postgresql://reader@127.0.0.1:{free_port()}/postgres", SPEC, query="SELECT 1")
    (tmp_path / "wrong").write_text("not-the-password\n")
    (tmp_path / "wrong").chmod(0o600)
    set_password_file(tmp_path / "wrong")
    try:
        with pytest.raises(DatabaseLoginError, match=r"refused the login .*password authentication failed"):
            read_table(pg.url("reader"), SPEC, query="SELECT * FROM people")
    finally:
        set_password_file(root / "pw")
    with pytest.raises(PasswordInUrlError, match="carries a password"):
        read_table(f"postgresql://reader:secret@127.0.0.1:{pg.port}/postgres", SPEC, query="SELECT 1")
    with pytest.raises(PasswordInUrlError):
        check_url(f"postgresql://reader@127.0.0.1:{pg.port}/postgres?password=secret")


def test_slices_at_one_snapshot_read_every_row_once_whatever_commits_meanwhile(
    server: tuple[PostgresServer, Path],
) -> None:
    pg, _ = server
    pg.load("moving", people(5_000, seed=9))
    pg.execute("GRANT SELECT ON moving TO reader")
    url = pg.url("reader")
    query = "SELECT id, education, age FROM moving"
    register_query(url, query)
    release_snapshots()  # an earlier test's snapshot predates this table
    before = query_fingerprint(url, query)
    parts = query_partitions(url, 1_000)
    assert len(parts) == 5 and {p[3] for p in parts} == {held_snapshot(check_url(url))}
    pg.execute("DELETE FROM moving WHERE id < 'p0002000'", "INSERT INTO moving VALUES ('new', 'no college', 30, 0)")
    slices = [read_slice(u, q, part, snapshot, SPEC) for u, q, part, snapshot, _ in parts]
    ids = np.concatenate([np.asarray(s.ids.to_pylist()) for s in slices])
    assert ids.size == 5_000 and np.unique(ids).size == 5_000 and "new" not in ids  # the snapshot's rows, once each
    assert query_fingerprint(url, query) == before  # the held snapshot: one table for the whole process


def _curator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "secure_release.curator", *args], env=child_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_cli_exits_2_or_1_by_name_and_leaves_nothing(server: tuple[PostgresServer, Path], tmp_path: Path) -> None:
    pg, root = server
    keystore = tmp_path / "ks"
    base = ["budget", "set", "--keystore", str(keystore), "--epsilon", "1", "--query", "SELECT * FROM people"]
    cases = {
        f"postgresql://reader:{'x' * 8}@127.0.0.1:{pg.port}/postgres": (2, "PasswordInUrlError"),
        f"postgresql://reader@127.0.0.1:{free_port()}/postgres": (1, "DatabaseUnreachableError"),
        f"postgresql://nobody@127.0.0.1:{pg.port}/postgres": (2, "DatabaseLoginError"),
    }
    for url, (code, name) in cases.items():
        done = _curator(*base, "--data", url, "--data-password-file", str(root / "pw"))
        assert (done.returncode, name) == (code, name) and name in done.stderr, done.stderr
        assert "x" * 8 not in done.stderr + done.stdout
        assert not keystore.exists()
    done = _curator(*base, "--data", pg.url("reader"), "--data-password-file", str(root / "pw"))
    assert done.returncode == 0, done.stderr
    assert (root / "pw").read_text().strip() not in done.stderr + done.stdout


def test_schema_draft_and_check_and_the_notebook_read_a_query(server: tuple[PostgresServer, Path],
                                                             tmp_path: Path) -> None:
    pg, root = server
    query = "SELECT id, education FROM people"
    flags = ["--query", query, "--data-password-file", str(root / "pw")]
    draft = subprocess.run([sys.executable, "-m", "secure_release", "schema", "draft", pg.url("reader"), *flags,
                            "--curator", "alice", "--out", str(tmp_path / "alice.json")],
                           env=child_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert draft.returncode == 0, draft.stderr
    drafted = json.loads((tmp_path / "alice.json").read_text())
    assert drafted["attributes"] == [{"name": "education",
                                      "categories": ["no college", "post-graduate", "some college"]}]
    check = subprocess.run([sys.executable, "-m", "secure_release", "schema", "check", pg.url("reader"),
                            str(tmp_path / "alice.json"), *flags],
                           env=child_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0 and f"{ROWS} rows match schema 'alice'" in check.stdout, check.stderr
    from secure_release import api

    source = database_query(pg.url("reader"), query, root / "pw")
    table = api.curator_tables({"alice": source}, {"alice": str(tmp_path / "alice.json")})[0]
    direct = read_table(pg.url("reader"), load_schema(tmp_path / "alice.json"), query=query)
    assert np.array_equal(np.sort(table.ids), np.sort(direct.ids)) and table.num_rows == ROWS
