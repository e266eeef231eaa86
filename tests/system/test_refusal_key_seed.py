"""A key refused and a seed reused before the agreement are heard by every party within seconds,
through the real processes (issue 47, item 1; docs/deployment.md, "Exit codes").

**Key.** The project CA revoked bob's certificate and the leader alice installed the new CRL;
bob, his own copy not yet updated, starts the release. alice's access check refuses his tags
(UNAUTHENTICATED, "revoked"): bob exits 3 and records at the server that he refuses the release
for a key reason (``DeclareRelease``), so alice's wait for his tags and the researcher's fetch
read it and exit 3 within seconds, naming bob and "key", not at their ``--timeout``.

**Seed.** A follower whose ledger already holds the sampling seed the leader draws (here injected
with --insecure-test-seed; an earlier release of bob used it) refuses at its reservation, after
the agreement and before any upload: it joins the agreed spec's candidate at the server only to
abort it with the refusal, so the leader and the researcher read ABORTED with a marked reason
and exit 3, like bob. (The leader's side is tests/system/test_leader_refusal.py.)

Each test asserts every party's exit code, that all exited within :data:`WITHIN_S` of the start,
that the refusing curator and the class are named, and that no data value crossed."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import child_env, demo_world
from test_refusal_before_agreement import FETCH_TIMEOUT, WITHIN_S, _exits, _fetch

from secure_release.cluster import Cluster, launch_release, set_budgets
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.infra.pki import revoke
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.privacy.ledger import EntryKind

#: The seed the leader draws in the seed test (an insecure test flag) and bob's ledger already holds.
SEED = Seed(bytes([23]) * 32)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_world(tmp_path_factory.mktemp("refusal-key-seed"), rows=1500, seed=5)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, env=child_env(testing=True))  # testing: --insecure-test-seed
    try:
        yield c
    finally:
        c.close()


def _values(world: Path, curator: str, count: int = 20) -> list[str]:
    """Some ids of ``curator``'s table: none may appear in another party's output."""
    lines = (world / "data" / f"{curator}.csv").read_text().splitlines()[1 : count + 1]
    return [line.split(",")[0] for line in lines]


def test_a_certificate_the_leader_refuses_is_heard_by_every_party_within_seconds(
    cluster: Cluster, world: Path, tmp_path: Path
) -> None:
    certs = tmp_path / "certs"
    shutil.copytree(world / "certs", certs)
    revoked = revoke(certs / "ca", name="bob")
    assert len(revoked) == 1
    shutil.copy(certs / "ca" / "crl.pem", certs / "alice" / "crl.pem")  # only alice has the new CRL yet
    fast = ["--timeout", FETCH_TIMEOUT]
    addrs = launch_release(cluster, world / "data", certs, "r-key", 0.5, 300, "chacha20", world / "align.key",
                           alice_extra=fast, bob_extra=fast)  # fmt: skip
    codes, took, err, tails, last = _outcome(cluster, world, addrs, "r-key")
    # bob exits 3 too: his certificate was refused by a peer (PERMISSION_DENIED/UNAUTHENTICATED)
    assert codes == {"alice": 3, "bob": 3, "fetch": 3}, (codes, err[-1500:], tails)
    assert max(took.values()) < WITHIN_S, took
    assert last.startswith("secure-release-researcher: refused: "), last
    assert "bob refuses release 'r-key' before the agreement: key (" in last and "revoked" in last, last
    alice_last = cluster.tail("alice", 1)
    assert "refused: " in alice_last and "bob refuses release 'r-key'" in alice_last, alice_last
    assert ": key (" in alice_last, alice_last
    assert "revoked" in cluster.tail("bob", 1), cluster.tail("bob", 1)
    for value in _values(world, "alice") + _values(world, "bob"):
        assert value not in err and value not in tails["alice"] and value not in tails["bob"], value


def _outcome(cluster: Cluster, world: Path, addrs: dict[str, str], rid: str) -> tuple[
    dict[str, int], dict[str, float], str, dict[str, str], str
]:
    """Every party's exit code and seconds to it once the researcher fetches ``rid``, the
    fetch's stderr, the curators' last 60 log lines and the fetch's last line (printed too)."""
    t0 = time.monotonic()
    codes, took, err = _exits(cluster, _fetch(cluster, world, addrs["server"], rid), t0)
    print("seconds until exit:", {k: round(v, 1) for k, v in took.items()})
    tails = {c: cluster.tail(c, 60) for c in ("alice", "bob")}
    last = err.strip().splitlines()[-1] if err.strip() else ""
    print("last lines:", {"alice": cluster.tail("alice", 1), "bob": cluster.tail("bob", 1), "fetch": last})
    return codes, took, err, tails, last


def test_a_follower_whose_ledger_holds_the_seed_is_heard_by_every_party_within_seconds(
    cluster: Cluster, world: Path
) -> None:
    data = world / "data"
    fast = ["--timeout", FETCH_TIMEOUT]
    alice = [*fast, "--insecure-test-seed", SEED.reveal().hex()]
    keystores = {c: cluster.root / f"keystore-{c}" for c in ("alice", "bob")}
    set_budgets(cluster, {keystores[c]: data / f"{c}.csv" for c in keystores}, 2.0, world / "certs")
    # an earlier release of bob drew this seed: his ledger passes the check before the agreement
    # (the seed is not known yet) and refuses his reservation, after the leader reserved its own
    ledger = LedgerFile(keystores["bob"], HeadSigner.from_certs(world / "certs" / "bob", "bob"))
    dataset = ledger.read().entries[0].dataset
    ledger.update(lambda led: led.reserve(dataset, dataset, "earlier", 0.25, SEED.fingerprint, 0.0))
    addrs = launch_release(cluster, data, world / "certs", "r-seed-f", 0.5, 300, "chacha20", world / "align.key",
                           alice_extra=alice, bob_extra=fast, budgets=False)  # fmt: skip
    codes, took, err, tails, last = _outcome(cluster, world, addrs, "r-seed-f")
    assert codes == {"alice": 3, "bob": 3, "fetch": 3}, (codes, err[-1500:], tails)
    assert max(took.values()) < WITHIN_S, took
    assert last.startswith("secure-release-researcher: refused: "), last
    # the reservation's refusal names the curator and the class by its error (seed: SeedReuseError)
    assert "bob cannot reserve its budget: SeedReuseError: sampling seed" in last and "already used" in last, last
    alice_last = cluster.tail("alice", 1)
    assert "refused: " in alice_last and "bob cannot reserve its budget: SeedReuseError" in alice_last, alice_last
    assert "SeedReuseError" in cluster.tail("bob", 1), cluster.tail("bob", 1)
    assert "not PERTURBED" not in err
    for value in _values(world, "alice") + _values(world, "bob"):
        assert value not in err and value not in tails["alice"] and value not in tails["bob"], value
    # nothing is left reserved for this release: alice (who reserved first) was refunded once the
    # server confirmed ABORTED, bob reserved nothing; bob's earlier reservation stands
    alice_charges = Keystore(keystores["alice"]).ledger.read().releases()
    assert alice_charges["r-seed-f"].state is EntryKind.REFUND, alice_charges
    bob_charges = Keystore(keystores["bob"]).ledger.read().releases()
    assert "r-seed-f" not in bob_charges and bob_charges["earlier"].state is EntryKind.RESERVE, bob_charges
