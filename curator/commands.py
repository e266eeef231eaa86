"""The curator's operator commands besides ``run``.

- ``budget set --keystore K --data FILE --epsilon E [--dataset NAME]
  [--per-release-epsilon E1 --delta D]``: the data set's total
  budget, recorded in the ledger (the only way a budget is set); ``budget show``: the history.
  A data set is a population, named by ``--dataset`` (default: the --data file's or directory's
  name); a refreshed or edited table under the same name spends from the same budget. With
  ``--certs DIR --name NAME`` the ledger's head is signed (and verified) with the curator's key;
  with ``--server`` too, ``budget set`` first carries over what the server's witness knows was
  spent on the data set beyond the ledger (a lost or rolled-back ledger never forgets spending).
- ``release status ID`` / ``release abort ID --reason TEXT``: the server's view of a release
  (with this curator's certificate) and the local ledger's; an abort refunds the local
  reservation once the server confirms ABORTED.
- ``budget set|show --keystore K --table-id T``: the same as ``--data`` of the file stored table T
  was encrypted from: releases from a stored table (server-side sampling) and ordinary releases of
  the same file draw on one budget, so storing a table never doubles it.
- ``table status ID`` / ``table delete ID``: a stored table at the server; a delete erases its
  ciphertext at the server and this curator's table key (``--keystore``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from secure_release.curator.partitions import dataset_fingerprint, dataset_name, require_data
from secure_release.curator.postgres import set_password_file
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.records.witness import BudgetWitness, carry_over
from secure_release.infra.config import ConfigError, require
from secure_release.infra.tls import secure_channel
from secure_release.mechanism.privacy.accounting import AccountingPolicy, pld_policy
from secure_release.mechanism.privacy.ledger import LostHistoryError, PrivacyLedger
from secure_release.mechanism.protocol.spec import check_name, check_party_name
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

T = TypeVar("T")
CALL_S = 10.0


def add_budget_parser(sub: Any) -> None:
    """``budget set|show``."""
    b = sub.add_parser("budget", help="set or show a data set's privacy budget (the ledger)")
    bsub = b.add_subparsers(dest="action", metavar="ACTION")
    s = bsub.add_parser("set", help="set the total epsilon budget of a data set")
    s.add_argument("--keystore", required=True, help="the curator's keystore directory")
    s.add_argument("--data", help="the table file, directory or glob (its name is the default data set)")
    s.add_argument("--table-id", help="instead of --data: the data set a stored table was made from (one budget)")
    s.add_argument("--dataset", help="the data set (the population); default: the --data file's name")
    s.add_argument("--epsilon", type=float, required=True, help="total budget, finite and > 0")
    s.add_argument("--per-release-epsilon", type=float, default=None,
                   help="with --delta: the PLD accounting policy (every release has exactly this epsilon; the budget "
                        "is the largest number of them whose optimal composition stays within (--epsilon, --delta))")
    s.add_argument("--delta", type=float, default=None, help="with --per-release-epsilon: the target delta, e.g. 1e-9")
    w = bsub.add_parser("show", help="print the ledger's budgets, releases and entries (JSON)")
    w.add_argument("--keystore", required=True, help="the curator's keystore directory")
    w.add_argument("--data", help="only this table file's (directory's, glob's) data set")
    w.add_argument("--table-id", help="only the data set this stored table was made from")
    w.add_argument("--dataset", help="only this data set")
    for p in (s, w):
        p.add_argument("--query", help="with a postgresql://HOST[:PORT]/DB --data: the SQL whose rows are the data set")
        p.add_argument("--data-password-file", metavar="FILE",
                       help="with a postgresql:// --data: the file whose first line is the role's password")
        p.add_argument("--certs", help="directory with NAME.key: sign (set) and verify the ledger's head")
        p.add_argument("--name", help="this curator's certificate name (with --certs or --server)")
        p.add_argument("--server", help="HOST:PORT of the release server: its budget witness is consulted")
        p.add_argument("--insecure", action="store_true", help="plaintext gRPC to --server (tests/demos only!)")


def _add_server_flags(p: Any, keystore_help: str) -> None:
    """The flags every operator command needs to reach the server as this curator."""
    p.add_argument("--server", required=True, help="HOST:PORT of the release server")
    p.add_argument("--certs", help="directory with ca.pem, NAME.pem, NAME.key")
    p.add_argument("--name", required=True, help="this curator's certificate name")
    p.add_argument("--keystore", help=keystore_help)
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC (tests/demos only!)")


def add_release_parser(sub: Any) -> None:
    """``release status|abort ID``."""
    r = sub.add_parser("release", help="a release's status at the server, or abort it")
    rsub = r.add_subparsers(dest="action", metavar="ACTION")
    for action, text in (("status", "print the release's state"), ("abort", "abort it before sealing")):
        p = rsub.add_parser(action, help=text)
        p.add_argument("release_id", metavar="ID")
        _add_server_flags(p, "also show (and on abort, refund) the local ledger's entry")
        if action == "abort":
            p.add_argument("--reason", required=True, help="shown to every party")


def add_table_parser(sub: Any) -> None:
    """``table status|delete ID``."""
    t = sub.add_parser("table", help="a stored table (server-side sampling) at the server, or delete it")
    tsub = t.add_subparsers(dest="action", metavar="ACTION")
    for action, text in (
        ("status", "print the stored table's state"),
        ("delete", "delete it at the server (its ciphertext is erased) and forget its table key"),
    ):
        p = tsub.add_parser(action, help=text)
        p.add_argument("table_id", metavar="ID")
        _add_server_flags(p, "(delete) the keystore holding the table key to forget")


def _dataset(args: argparse.Namespace) -> tuple[str, str]:
    """(data set, fingerprint of the table file, directory or glob, or "") of ``--dataset``,
    ``--data`` or ``--table-id``."""
    if args.data and getattr(args, "table_id", None):
        raise ConfigError("give at most one of --data FILE or --table-id ID")
    query = getattr(args, "query", None) or None
    if args.data:
        require_data(args.data, "--data", query)  # a typo (or an empty directory) is named, never a new data set
        set_password_file(getattr(args, "data_password_file", None))
    fingerprint = dataset_fingerprint(args.data, query) if args.data else ""
    if args.dataset:
        return check_name(args.dataset, "--dataset"), fingerprint
    if args.data:
        return dataset_name(args.data, query), fingerprint
    if getattr(args, "table_id", None):
        record = Keystore(args.keystore).load_table(args.table_id)
        if record is None:
            raise ConfigError(
                f"this keystore has stored no table {args.table_id!r}: a stored table's budget is its data set's, "
                "so set it with --data FILE or --dataset NAME (before or after 'store-table')"
            )
        return record.dataset_name, record.table_fingerprint
    raise ConfigError("give --dataset NAME, --data FILE or --table-id ID")


def _ledger(args: argparse.Namespace) -> LedgerFile:
    """The keystore's ledger, signed with ``--certs/NAME.key`` if given."""
    signer = None
    if args.certs:
        signer = HeadSigner.from_certs(args.certs, check_party_name(require_name(args), "curator name"))
    return LedgerFile(args.keystore, signer)


def require_name(args: argparse.Namespace) -> str:
    """``--name`` (needed with --certs or --server)."""
    if not args.name:
        raise ConfigError("--name NAME is needed with --certs or --server (this curator's certificate name)")
    return str(args.name)


def _witness(args: argparse.Namespace, ledger: LedgerFile) -> tuple[BudgetWitness, grpc.Channel] | None:
    """The server's budget witness for ``--server`` (None without it)."""
    if not args.server:
        return None
    if not args.insecure:
        require(args, "certs")
    name = check_party_name(require_name(args), "curator name")
    certs = Path(args.certs) if args.certs else None
    channel = secure_channel(args.server, certs, name, args.insecure, role="curator", peer_role="server")
    return BudgetWitness(pb_grpc.ReleaseServerStub(channel), name, ledger.signer), channel


def budget(args: argparse.Namespace) -> int:
    """``budget set|show``; 0 on success."""
    if args.action == "set":
        return _budget_set(args)
    if args.action == "show":
        if not Path(args.keystore).is_dir():
            raise ConfigError(
                f"--keystore {args.keystore}: no such keystore ('budget set' creates one; 'run' uses keystore-NAME "
                "unless --keystore is given)"
            )
        ledger = _ledger(args)
        only = _dataset(args)[0] if args.data or args.table_id or args.dataset else None
        out = ledger_summary(ledger.read(), only)
        linked = _witness(args, ledger)
        if linked is not None and only is not None:
            with linked[1]:
                count, total = linked[0].known(only)
            out["witness"] = {"reservations": count, "epsilon_total": total}
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
        return 0
    raise ConfigError("budget needs an action: set or show")


def _budget_set(args: argparse.Namespace) -> int:
    """Carry over what the witness knows, adopt an unsigned head, append the budget entry."""
    dataset, fingerprint = _dataset(args)  # checks --data before the keystore is created
    ledger = _ledger(args)
    if not args.server and ledger.was_deleted():
        raise LostHistoryError(
            f"{ledger.path} was deleted although its head records entries: setting a budget now would forget what "
            "was spent. Give --server HOST:PORT (with --certs and --name) so the server's witness carries the "
            "spending over, or restore the ledger from a backup"
        )
    ledger.reset_after_deletion()
    adopted = ledger.adopt_unsigned()
    carried = None
    linked = _witness(args, ledger)
    if linked is not None:
        with linked[1]:
            carried = carry_over(ledger, linked[0], dataset, dataset)
            linked[0].check(ledger.read(), dataset, record=True)
    policy = _policy(args)
    entry = ledger.set_budget(dataset, dataset, args.epsilon, fingerprint, policy)
    led = ledger.read()
    out: dict[str, Any] = {
        "dataset": entry.dataset,
        "fingerprint": fingerprint,
        "budget": entry.epsilon,
        "spent": led.spent(dataset),
        "remaining": led.remaining(dataset),
        "signed": ledger.signer is not None,
        "witness": "consulted" if linked is not None else "not consulted (no --server)",
    }
    if policy is not None:
        out["policy"] = policy.to_dict()
    if carried is not None:
        out["carried_over"] = {"reservations": carried.count, "epsilon": carried.epsilon}
    if adopted:
        out["note"] = "the ledger's head was unsigned; it is now signed with this curator's key"
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


def _policy(args: argparse.Namespace) -> AccountingPolicy | None:
    """The PLD policy of ``budget set`` (both --per-release-epsilon and --delta, or neither)."""
    per, delta = getattr(args, "per_release_epsilon", None), getattr(args, "delta", None)
    if per is None and delta is None:
        return None
    if per is None or delta is None:
        raise ConfigError("the PLD accounting policy needs both --per-release-epsilon and --delta")
    return pld_policy(args.epsilon, delta, per)


def policy_views(ledger: PrivacyLedger, dataset: str) -> dict[str, Any] | None:
    """Both views of a data set whose budget has a PLD policy: basic composition (epsilons add)
    and the optimal composition (dp_accounting's PLD at the policy's delta) of the releases
    spent or reserved."""
    policy = ledger.policy(dataset)
    if policy is None:
        return None
    used, eps = ledger.release_count(dataset), policy.per_release_epsilon
    return {
        "policy": policy.to_dict(),
        "basic": {
            "releases_allowed": math.floor(policy.total_epsilon / eps * (1 + 1e-12)),
            "epsilon_spent": used * eps,
            "releases_spent": used,
        },
        "pld": {
            "releases_allowed": policy.max_releases,
            "releases_spent": used,
            "releases_left": policy.max_releases - used,
            "epsilon_spent": policy.composed_epsilon(used),
            "delta": policy.delta,
        },
    }


def ledger_summary(ledger: PrivacyLedger, only: str | None = None) -> dict[str, Any]:
    """Budgets, spent and remaining per data set (with a PLD policy: both views), every
    release's state, every entry."""
    datasets = sorted({e.dataset for e in ledger.entries if only in (None, e.dataset)})
    return {
        "datasets": [
            {
                "dataset": d,
                "name": ledger.name_of(d),
                "fingerprint": (ledger.tables(d) or [""])[-1],  # the table file read last
                "tables": ledger.tables(d),
                "budget": ledger.budget(d),
                "spent": ledger.spent(d),
                "remaining": ledger.remaining(d),
                **({"accounting": views} if (views := policy_views(ledger, d)) is not None else {}),
            }
            for d in datasets
        ],
        "releases": {
            r.release_id: {"state": r.state.value, "epsilon": r.epsilon, "dataset": r.dataset}
            for r in ledger.releases().values()
            if r.dataset in datasets
        },
        "entries": [e.body() for e in ledger.entries if e.dataset in datasets],
    }


def _status_json(status: pb.ReleaseStatus) -> dict[str, Any]:
    return {
        "release_id": status.release_id,
        "state": pb.ReleaseState.Name(status.state).removeprefix("RELEASE_STATE_"),
        "abort_reason": status.abort_reason,
        "curators": {
            p.curator: {"registered": p.registered, "committed": p.committed, "chunks_held": len(p.chunks_held)}
            for p in status.curators
        },
    }


def _ask_server(args: argparse.Namespace, name: str, call: Callable[[pb_grpc.ReleaseServerStub], T]) -> T | str:
    """One call to the release server with this curator's certificate: its answer, or the
    refusal as "CODE: details" (the commands then exit 1)."""
    if not args.insecure:
        require(args, "certs")
    certs = Path(args.certs) if args.certs else None
    with secure_channel(args.server, certs, name, args.insecure, role="curator", peer_role="server") as channel:
        try:
            return call(pb_grpc.ReleaseServerStub(channel))
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"


def release(args: argparse.Namespace) -> int:
    """``release status|abort ID``: 0 on success, 1 if the server refused (e.g. sealed)."""
    if args.action not in ("status", "abort"):
        raise ConfigError("release needs an action: status or abort")
    release_id, name = check_name(args.release_id, "release id"), check_party_name(args.name, "curator name")
    if args.action == "abort":
        abort = pb.AbortRequest(release_id=release_id, curator=name, reason=args.reason)
        answer = _ask_server(args, name, lambda stub: stub.AbortRelease(abort, timeout=CALL_S))
    else:
        ask = pb.ReleaseStatusRequest(release_id=release_id)
        answer = _ask_server(args, name, lambda stub: stub.GetReleaseStatus(ask, timeout=CALL_S))
    status = None if isinstance(answer, str) else answer
    out: dict[str, Any] = {"server": {"error": answer} if status is None else _status_json(status)}
    if args.keystore:
        out["ledger"] = _local(args, release_id, status)
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return 1 if status is None else 0


def _local(args: argparse.Namespace, release_id: str, status: pb.ReleaseStatus | None) -> dict[str, Any]:
    signer = None if args.insecure or not args.certs else HeadSigner.from_certs(args.certs, args.name)
    keystore = Keystore(args.keystore, signer)
    if args.action == "abort" and status is not None and status.state == pb.RELEASE_STATE_ABORTED:
        if release_id in keystore.ledger.read().releases():
            keystore.ledger.update(lambda led: led.refund(release_id, time.time()))
        keystore.drop_record(release_id)
    known = keystore.ledger.read().releases().get(release_id)
    return {"state": known.state.value, "epsilon": known.epsilon} if known else {"state": "unknown"}


def table(args: argparse.Namespace) -> int:
    """``table status|delete ID``: 0 on success, 1 if the server refused."""
    if args.action not in ("status", "delete"):
        raise ConfigError("table needs an action: status or delete")
    table_id, name = check_name(args.table_id, "table id"), check_party_name(args.name, "curator name")
    if args.action == "delete":
        delete = pb.DeleteTableRequest(table_id=table_id, curator=name)
        answer = _ask_server(args, name, lambda stub: stub.DeleteTable(delete, timeout=CALL_S))
    else:
        ask = pb.TableStatusRequest(table_id=table_id)
        answer = _ask_server(args, name, lambda stub: stub.GetTableStatus(ask, timeout=CALL_S))
    status = None if isinstance(answer, str) else answer
    out: dict[str, Any] = {"server": {"error": answer}} if status is None else {"server": {
        "table_id": status.table_id,
        "n": status.n,
        "complete": status.complete,
        "deleted": status.deleted,
        "curators": {p.curator: {"committed": p.committed, "chunks_held": len(p.chunks_held)} for p in status.parts},
    }}  # fmt: skip
    code = 1 if status is None else 0
    if args.action == "delete" and args.keystore and status is not None:
        Keystore(args.keystore).drop_table(table_id)
        out["table_key"] = "forgotten"
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return code
