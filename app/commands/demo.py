"""``secure-release demo``: a whole release on this machine, every party its own process.

PKI (project CA) -> server, alice (leading curator), bob and the researcher as separate
processes talking gRPC over mutual TLS on OS-chosen ports -> one release of the Adult table ->
the analyst asks the researcher for the estimate -> a table of estimate vs truth.

With ``--question``: the release is designed for the researcher's questions (one table a block of
questions, disjoint samples, one epsilon: docs/analysis.md), every curator runs the design file,
and the demo prints each question's answer beside what the whole joint would have planned.

With ``--sampling server``: the curators store the aligned table once, encrypted under
their table keys (``store-table``), then two releases run from it with no data file: the server
draws a fresh sample for each, the curators re-key it and charge their table ledgers twice.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from secure_release import display
from secure_release.cluster import (
    Cluster,
    free_port,
    get_estimate,
    launch_release,
    parties,
    progress,
    wait_exit,
)
from secure_release.demo_data import MAX_CURATORS
from secure_release.infra.designfile import write_design

#: --alignment psi in the demo: at most this many rows (~0.12-0.22 ms of one core per id per curator).
MAX_PSI_ROWS = 20_000

def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run a whole release locally: PKI, server, N curators, researcher (mTLS)",
        description=(
            "Run one release of the bundled UCI Adult table end to end on this machine: a project "
            "CA, the server, the curators (two by default: alice holds education and marital, bob "
            "sex and salary; --curators 3 or 4 splits the same attributes further, 5 to 8 use a "
            "synthetic table) and the researcher as separate processes over mutual TLS; then print "
            "the researcher's estimate with standard errors and 95%% intervals beside the truth, "
            "each column and parameter explained, and the privacy guarantee."
        ),
        epilog="Examples:\n  secure-release demo\n  secure-release demo --curators 3 --epsilon 1.0\n"
        "  secure-release demo --json > demo.json\n"
        "  secure-release demo --sampling indices --alignment psi --rows 5000\n"
        "  secure-release demo --sampling server     # store the table once, then two releases from it\n"
        '  secure-release demo --question "salary ~ education | sex"   # a release designed for the question',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--epsilon", type=float, default=0.5, help="privacy level epsilon > 0 (default 0.5)")
    p.add_argument("--m", type=int, default=None, help="sample size in [1, n] (default: m*, Cor. 3.6)")
    p.add_argument("--cipher", choices=["otp", "chacha20"], default="chacha20", help="pad kind")
    p.add_argument("--rows", type=int, default=None, help="synthetic rows >= 10 (default: the 45,222 Adult records)")
    p.add_argument("--curators", type=int, default=2, help=f"number of curators, 2 to {MAX_CURATORS} (default 2)")
    p.add_argument(
        "--sampling",
        choices=["seed", "indices", "server"],
        default="seed",
        help="seed: the leader sends a 32-byte seed (pseudorandom sample); indices: it sends the packed "
        "ordered m-tuple drawn from the OS CSPRNG (no seed expansion; ceil(log2 n) bits a position); server: the "
        "curators store the whole table once, encrypted under their table keys, then run two releases "
        "from it: the server draws each sample (never shown to the researcher), each curator re-keys the "
        "sampled rows to a fresh per-release pad and charges its ledger for the table",
    )
    p.add_argument(
        "--alignment",
        choices=["hash", "psi"],
        default="hash",
        help="hash: keyed-hash id tags (fast); psi: N-party ECDH private set intersection through the "
        f"leader, ~0.12-0.22 ms of one core per id per curator, so only with a small --rows (at most {MAX_PSI_ROWS:,})",
    )
    p.add_argument(
        "--question",
        action="append",
        default=None,
        metavar="Q",
        help="design the release for this question (repeatable): 'A ~ B', 'A ~ B | C + D' or 'Y ~ X1 + X2'; "
        "the release is then the design's tables from disjoint samples at the same epsilon, and the demo "
        "prints each answer and the whole joint's planned figures beside it (docs/analysis.md)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--keep", type=Path, default=None, help="keep the working directory here")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Named errors for out-of-range flags, before anything starts."""
    from secure_release.mechanism.errors import InvalidSampleSizeError, TooFewCuratorsError
    from secure_release.mechanism.privacy.accounting import check_epsilon

    check_epsilon(args.epsilon)
    if not 2 <= args.curators <= MAX_CURATORS:
        raise TooFewCuratorsError(f"--curators takes 2 to {MAX_CURATORS}, got {args.curators}")
    if args.rows is not None and args.rows < 10:
        raise InvalidSampleSizeError(f"--rows must be >= 10, got {args.rows}")
    if args.m is not None and args.m < 1:
        raise InvalidSampleSizeError(f"--m must be an integer >= 1, got {args.m}")
    if args.question and args.sampling == "server":
        from secure_release.mechanism.errors import DesignMismatchError

        raise DesignMismatchError("--question designs a release the curators sample; it does not combine with "
                                  "--sampling server (use --sampling seed or indices)")  # fmt: skip
    if args.alignment == "psi" and (args.rows is None or args.rows > MAX_PSI_ROWS):
        raise InvalidSampleSizeError(
            f"--alignment psi costs ~0.12-0.22 ms of one core per id per curator; "
            f"give --rows of at most {MAX_PSI_ROWS:,} "
            f"(got {'the 45,222 Adult records' if args.rows is None else args.rows})"
        )


def _sizes(data: Path, curators: Sequence[str]) -> tuple[int, ...]:
    """Each curator's alphabet size, from its schema file."""
    from secure_release.curator.table import load_schema

    return tuple(load_schema(data / f"{c}.json").schema.alphabet_size for c in curators)


def run(args: argparse.Namespace) -> int:
    from secure_release.demo_data import write_demo_data
    from secure_release.infra.pki import init_pki
    from secure_release.mechanism.privacy.plan import plan_release

    check_args(args)
    os.umask(0o077)  # the demo's tables, keys, logs, store and results: private to this user
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        root, tmp = args.keep, None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="secure-release-demo-")
        root = Path(tmp.name)
    cluster = Cluster(root)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        progress(f"working directory {root}")
        info = write_demo_data(root / "data", args.rows, curators=args.curators)
        curators = info["curators"]
        progress(f"demo data: {info['n']} records split over {', '.join(curators)}")
        sizes = _sizes(root / "data", curators)
        for line in display.warning_lines(plan_release(info["n"], sizes, args.epsilon, args.m)):
            progress(line)
        init_pki(root / "certs", parties(curators), force=True)
        progress(f"PKI created: the CA in certs/ca, one directory per party ({len(curators) + 3}: certs/NAME)")
        akey = root / "alignment.key"
        akey.write_text(secrets.token_hex(32))
        akey.chmod(0o600)
        if args.sampling == "server":
            return _server_sampled(cluster, root, akey, info, sizes, args)
        if args.question:
            return _designed(cluster, root, akey, info, args)
        addrs = launch_release(
            cluster, root / "data", root / "certs", "demo-1", args.epsilon, args.m, args.cipher, akey,
            curators=curators, sampling=args.sampling, alignment=args.alignment,
        )  # fmt: skip
        progress("release running; asking the researcher for the estimate as analyst")
        resp = get_estimate(addrs["researcher"], root / "certs", "demo-1")
        report, truth = _report(resp, info, sizes)
        result = _summary(report, truth, info)
        question = _question(report)
        if question is not None:
            result["association"] = {"test": question[0].to_dict(), "effects": question[1].to_dict()}
        if args.json:
            print(json.dumps(result))
        else:
            print(display.explain(report, truth, result["l2_error"]))
            if question is not None:
                from secure_release import analysis

                print("\nThe paper's question: is salary associated with education? (docs/analysis.md)")
                print("\n".join([*analysis.test_lines(question[0]), *analysis.association_lines(question[1])[1:-1]]))
        return 0
    except KeyboardInterrupt:
        progress("interrupted; stopping every process")
        return 130
    except Exception as exc:
        import grpc

        if isinstance(exc, grpc.RpcError | RuntimeError):
            sys.stderr.write(f"secure-release demo: error: {exc}\n")
            for name in cluster.procs:
                sys.stderr.write(f"--- {name} log (tail) ---\n{cluster.tail(name, 10)}\n")
            return 1
        raise
    finally:
        cluster.close()
        if tmp is not None:
            tmp.cleanup()


def _designed(cluster: Cluster, root: Path, akey: Path, info: dict[str, Any], args: argparse.Namespace) -> int:
    """A release designed for ``--question``: the design from the curators' schemas, every curator
    runs its file, the researcher's tables answer the questions (``demo --question``)."""
    from secure_release.api import result_from_tables
    from secure_release.curator.table import load_schema
    from secure_release.infra.wire import tables_report_from_pb
    from secure_release.mechanism.analysis.design import design

    curators = list(info["curators"])
    schemas = [load_schema(root / "data" / f"{c}.json").schema for c in curators]
    d = design(int(info["n"]), schemas, args.epsilon, args.question, at_v=DEMO_AT_V)
    path = write_design(d, root / "design.json")
    progress(f"design {d.digest()[:16]}...: {len(d.release.tables)} table(s) for {len(d.questions)} question(s); "
             "every curator runs it (--design)")  # fmt: skip
    addrs = launch_release(
        cluster, root / "data", root / "certs", "demo-1", args.epsilon, None, args.cipher, akey,
        curators=curators, sampling=args.sampling, alignment=args.alignment,
        curator_extra={c: ["--design", str(path)] for c in curators},
    )  # fmt: skip
    progress("release running; asking the researcher for the tables as analyst")
    report = tables_report_from_pb(get_estimate(addrs["researcher"], root / "certs", "demo-1"))
    if report is None:
        raise RuntimeError("the researcher returned a single table for a designed release")
    result = result_from_tables(report)
    answers = result.questions()
    if args.json:
        print(json.dumps({"design": d.to_dict(), "digest": d.digest(), "questions": answers.to_dict(),
                          "result": report.to_dict()}, allow_nan=False, default=_plain))  # fmt: skip
    else:
        print(d)
        print()
        print(answers)
        print(f"\nThe whole joint at the same epsilon {args.epsilon:g} (K = {d.whole_joint.tables[0].joint_size}) "
              "would have planned the detectable V in the design's 'V joint' column above; the release "
              f"charged epsilon {report.epsilon:.6g} (Eq. T1; sequential composition {report.sequential_epsilon:.6g}).")
    return 0


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and arrays in the answers."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


#: The Cramer's V at which ``demo --question`` reports each question's planned power.
DEMO_AT_V = 0.2


#: The stored table and the releases of ``demo --sampling server``.
DEMO_TABLE = "demo-table"
SERVER_RELEASES = ("demo-1", "demo-2")


def _server_sampled(
    cluster: Cluster, root: Path, akey: Path, info: dict[str, Any], sizes: tuple[int, ...], args: argparse.Namespace
) -> int:
    """Store the table once, then two releases the server samples from it (``--sampling server``)."""
    curators, certs, data = list(info["curators"]), root / "certs", root / "data"
    sport = cluster.start("server", ["-m", "secure_release.server", "--listen", "127.0.0.1:0", "--store",
                                     str(root / "store"), "--certs", str(certs / "server"),
                                     "--name", "server"])  # fmt: skip
    server = f"127.0.0.1:{sport}"
    progress(f"server listening on {server}")
    ports = {c: free_port() for c in curators}  # each curator's key service, the same for every release
    net = ["--server", server, "--curators", ",".join(curators)]
    budget = max(1.0, 2 * args.epsilon)
    leader_port = 0
    for i, c in enumerate(curators):
        keystore = root / f"keystore-{c}"
        cmd = [sys.executable, "-m", "secure_release.curator", "budget", "set", "--keystore", str(keystore),
               "--data", str(data / f"{c}.csv"), "--epsilon", repr(budget),
               "--certs", str(certs / c), "--name", c]  # fmt: skip
        done = subprocess.run(cmd, env=cluster.env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"setting the table budget of {c} failed: {done.stderr.strip()[-500:]}")
        role = ["--leader"] if i == 0 else ["--leader-address", f"127.0.0.1:{leader_port}"]
        port = cluster.start(
            f"{c}-store",
            ["-m", "secure_release.curator", "store-table", "--table-id", DEMO_TABLE, "--data", str(data / f"{c}.csv"),
             "--schema", str(data / f"{c}.json"), "--name", c, "--keystore", str(keystore), *net,
             "--certs", str(certs / c),
             "--alignment-key-file", str(akey), "--alignment", args.alignment, "--listen", "127.0.0.1:0", *role],
        )  # fmt: skip
        leader_port = leader_port or int(port or 0)
    wait_exit(cluster, [f"{c}-store" for c in curators])
    progress(f"table {DEMO_TABLE!r} stored once: each curator's whole aligned column under its own table key")
    rport = cluster.start(
        "researcher",
        ["-m", "secure_release.researcher", "serve", "--listen", "127.0.0.1:0", "--certs", str(certs / "researcher"),
         "--name", "researcher", "--server", server,
         *(x for c in curators for x in ("--curator", f"{c}=127.0.0.1:{ports[c]}")),
         "--out", str(root / "results"), "--analyst", "analyst", "--allow-partial"],
    )  # fmt: skip
    results, text = [], []
    for rid in SERVER_RELEASES:
        for c in curators:
            cluster.start(
                f"{c}-{rid}",
                ["-m", "secure_release.curator", "run", "--sampling", "server", "--table-id", DEMO_TABLE,
                 "--release-id", rid, "--epsilon", repr(args.epsilon), "--cipher", args.cipher, "--name", c,
                 "--keystore", str(root / f"keystore-{c}"), *net, "--certs", str(certs / c),
                 "--grant", "researcher", "--exit-after-keys",
                 "--listen", f"127.0.0.1:{ports[c]}", *(["--m", str(args.m)] if args.m is not None else [])],
            )  # fmt: skip
        progress(f"release {rid}: the server samples the stored table; asking the researcher as analyst")
        resp = get_estimate(f"127.0.0.1:{rport}", certs, rid)
        wait_exit(cluster, [f"{c}-{rid}" for c in curators])
        report, truth = _report(resp, info, sizes)
        result = _summary(report, truth, info)
        result["sampling"], result["table_id"] = "server", DEMO_TABLE
        results.append(result)
        text.append(f"=== release {rid} (server-sampled from stored table {DEMO_TABLE!r}) ===\n"
                    + display.explain(report, truth, result["l2_error"]))  # fmt: skip
    ledgers = {c: _table_ledger(root / f"keystore-{c}") for c in curators}
    if args.json:
        print(json.dumps({"table_id": DEMO_TABLE, "releases": results, "ledgers": ledgers}))
    else:
        print("\n\n".join(text))
        spent = ", ".join(f"{c}: spent {v['spent']:g} of {v['budget']:g}" for c, v in ledgers.items())
        print(f"\nOne stored table, {len(SERVER_RELEASES)} releases with fresh server-drawn samples; "
              f"every curator's ledger for the table was charged once per release ({spent}).")  # fmt: skip
    return 0


def _table_ledger(keystore: Path) -> dict[str, Any]:
    from secure_release.curator.records.keystore import Keystore

    record = Keystore(keystore).load_table(DEMO_TABLE)
    assert record is not None, "the demo stores its table before any release"
    ledger = Keystore(keystore).ledger.read()
    name = record.table_fingerprint  # the data file's budget: stored-table releases share it
    releases = sorted(r for r, v in ledger.releases().items() if v.dataset == name)
    return {"budget": ledger.budget(name), "spent": ledger.spent(name), "releases": releases}


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _report(resp: Any, info: dict[str, Any], sizes: tuple[int, ...]) -> tuple[Any, list[float]]:
    """The response as a ReleaseReport (with the curators' real alphabet sizes) and the truth
    of each of its cells."""
    from dataclasses import replace

    from secure_release.infra.wire import report_from_pb

    report = report_from_pb(resp)
    report = replace(report, plan=replace(report.plan, alphabet_sizes=sizes), curators=tuple(info["curators"]))
    truth = [float(info["truth"].get("|".join(labels), 0.0)) for labels in report.labels]
    return report, truth


def _question(report: Any) -> tuple[Any, Any] | None:
    """The test and the effect sizes of education with salary, when the release has both (the
    synthetic tables of 5 to 8 curators do not)."""
    from secure_release import analysis

    if not {"education", "salary"} <= set(report.attributes):
        return None
    pair = ("education", "salary")
    return analysis.test_independence(report, *pair), analysis.association(report, *pair)


def _summary(report: Any, truth: list[float], info: dict[str, Any]) -> dict[str, Any]:
    """The demo's JSON: the report's cells with truth and interval marks, the plan, the
    guarantee in standard form, the utility check."""
    from secure_release.mechanism.privacy.guarantee import privacy_guarantee, utility_check

    plan = report.plan
    err = float(np.linalg.norm(report.estimate - np.asarray(truth)))
    marks = display.spans_zero(report.ci_low, report.ci_high)
    columns = {name: values.tolist() for name, values in report.columns().items()}  # the output vocabulary
    cells = [
        {"labels": list(labels), **{name: columns[name][c] for name in columns}, "truth": t, "ci_spans_zero": bool(z)}
        for c, (labels, t, z) in enumerate(zip(report.labels, truth, marks, strict=True))
    ]
    utility = utility_check(plan)
    return {
        "release_id": report.release_id,
        "curators": list(info["curators"]),
        "epsilon": plan.epsilon,
        "gamma": plan.gamma,
        "n": plan.n,
        "m": plan.m,
        "K": plan.joint_size,
        "alphabet_sizes": list(plan.alphabet_sizes),
        "l2_error": err,
        "predicted_rmse": utility["predicted_rmse"],
        "bound": plan.report()["bound"],
        "marginal": report.marginal,
        "attributes": list(report.attributes),
        "interval_method": report.interval_method,
        "cells": cells,
        "guarantee": privacy_guarantee(plan),
        "utility": utility,
        "columns": dict(display.COLUMNS),
    }
