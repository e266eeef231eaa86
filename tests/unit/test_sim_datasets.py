"""Synthetic tables and count-table readers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.simulation.datasets import largest_remainder, shares, synthetic_counts, two_curator_split
from secure_release.tables import adult, read_counts_csv, read_rows


@pytest.mark.parametrize("K", [12, 24, 48, 96, 192, 384, 768, 13])
@pytest.mark.parametrize("n", [45222, 1000, 7])
@pytest.mark.parametrize("kind", ["uniform", "linear", "peaky"])
def test_synthetic_sum_and_shape(kind: str, K: int, n: int) -> None:
    c = synthetic_counts(kind, K, n)
    assert c.shape == (K,) and c.sum() == n and np.all(c >= 0)
    assert np.all(np.abs(c - shares(kind, K) * n) < 1.0)
    k1, k2 = two_curator_split(K)
    assert k1 * k2 == K and k1 >= k2


def test_shapes_are_as_stated() -> None:
    lin = shares("linear", 24)
    q = sum(range(1, 25))
    np.testing.assert_allclose(lin, np.arange(1, 25) / q)
    peaky = shares("peaky", 24)
    assert peaky[0] == pytest.approx(0.9) and np.allclose(peaky[1:], 0.1 / 23)
    assert np.allclose(shares("uniform", 12), 1 / 12)
    assert largest_remainder([1, 1, 1], 10).tolist() == [4, 3, 3]
    assert two_curator_split(24) == (6, 4)


def test_adult_table() -> None:
    t = adult()
    assert t.n == 45222 and t.joint_size == 24 and t.alphabet_sizes == (6, 4)


def test_counts_csv_domains_split_and_zero_rows(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("a,b,c,count\nx,u,p,3\ny,u,p,0\nx,v,q,2\nx,u,p,1\n")
    t = read_counts_csv(p, "c:a,b")
    assert t.alphabet_sizes == (2, 4) and t.n == 6
    cube = t.counts.reshape(2, 2, 2)  # (c, a, b)
    assert cube[0, 0, 0] == 4 and cube[1, 0, 1] == 2 and cube.sum() == 6
    for text in ("a,b\nx,1\n", "a,count\nx,-1\ny,2\n", "a,count\nx,1.5\n", "a,count\nx,0\ny,0\n"):
        p.write_text(text)
        with pytest.raises(SecureReleaseError):
            read_counts_csv(p)


def test_rows_with_schema(tmp_path: Path) -> None:
    schema = {"curators": [
        {"name": "alice", "attributes": [{"name": "edu", "categories": ["lo", "hi"]}]},
        {"name": "bob", "attributes": [{"name": "sex", "categories": ["m", "f", "x"]}]},
    ]}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "r.csv").write_text("sex,edu\nm,lo\nf,hi\nf,hi\n")
    t = read_rows(tmp_path / "r.csv", tmp_path / "s.json")
    assert t.alphabet_sizes == (2, 3) and t.counts.tolist() == [1, 0, 0, 0, 2, 0]
    (tmp_path / "r.csv").write_text("sex,edu\nq,lo\n")
    with pytest.raises(SecureReleaseError):
        read_rows(tmp_path / "r.csv", tmp_path / "s.json")
