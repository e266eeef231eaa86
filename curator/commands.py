"""The curator's operator commands besides ``run``.

- ``budget set --keystore K --data FILE --epsilon E [--dataset NAME]``: the data set's total
  budget, recorded in the ledger (the only way a budget is set); ``budget show``: the history.
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
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from secure_release.curator.keystore import Keystore
from secure_release.curator.ledgerfile import LedgerFile, file_fingerprint
from secure_release.infra.config import ConfigError, require
from secure_release.infra.fileio import require_file
from secure_release.infra.tls import secure_channel
from secure_release.mechanism.ledger import PrivacyLedger
from secure_release.mechanism.spec import check_name, check_party_name
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
    s.add_argument("--data", help="the table file (identified by its SHA-256)")
    s.add_argument("--table-id", help="instead of --data: the data file a stored table was made from (one budget)")
    s.add_argument("--dataset", help="a name for people (default: the file name or table id)")
    s.add_argument("--epsilon", type=float, required=True, help="total budget, finite and > 0")
    w = bsub.add_parser("show", help="print the ledger's budgets, releases and entries (JSON)")
    w.add_argument("--keystore", required=True, help="the curator's keystore directory")
    w.add_argument("--data", help="only this table file's data set")
    w.add_argument("--table-id", help="only the data set of the file this stored table was made from")


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
    """(ledger data set, name for people) of ``--data`` or ``--table-id``."""
    if bool(args.data) == bool(getattr(args, "table_id", None)):
        raise ConfigError("give exactly one of --data FILE or --table-id ID")
    if args.data:
        return file_fingerprint(require_file(args.data, "--data")), args.dataset or Path(args.data).name
    record = Keystore(args.keystore).load_table(args.table_id)
    if record is None:
        raise ConfigError(
            f"this keystore has stored no table {args.table_id!r}: a stored table's budget is its data file's, "
            "so set it with --data FILE (before or after 'store-table')"
        )
    return record.table_fingerprint, args.dataset or record.dataset_name


def budget(args: argparse.Namespace) -> int:
    """``budget set|show``; 0 on success."""
    if args.action == "set":
        ledger = LedgerFile(args.keystore)
        fingerprint, name = _dataset(args)
        entry = ledger.set_budget(fingerprint, name, args.epsilon)
        sys.stdout.write(
            json.dumps(
                {
                    "dataset": entry.name,
                    "fingerprint": fingerprint,
                    "budget": entry.epsilon,
                    "remaining": ledger.read().remaining(fingerprint),
                }
            )
            + "\n"
        )
        return 0
    if args.action == "show":
        led = LedgerFile(args.keystore).read()
        only = _dataset(args)[0] if args.data or args.table_id else None
        sys.stdout.write(json.dumps(ledger_summary(led, only), indent=1) + "\n")
        return 0
    raise ConfigError("budget needs an action: set or show")


def ledger_summary(ledger: PrivacyLedger, only: str | None = None) -> dict[str, Any]:
    """Budgets, spent and remaining per data set, every release's state, every entry."""
    datasets = sorted({e.dataset for e in ledger.entries if only in (None, e.dataset)})
    return {
        "datasets": [
            {
                "fingerprint": d,
                "name": ledger.name_of(d),
                "budget": ledger.budget(d),
                "spent": ledger.spent(d),
                "remaining": ledger.remaining(d),
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
    keystore = Keystore(args.keystore)
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
