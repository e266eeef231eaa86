"""The researcher's pipeline for one release (reusing mechanism.protocol's steps).

fetch the perturbed rows (FetchPerturbed, digest verified) -> ask each curator for its key
(ReleaseKey; a refusal is recorded, not fatal) -> decrypt (protocol.researcher_decrypt with
mechanism.pads.ReleasePad) -> estimate (protocol.researcher_estimate; only the marginal of the
granting curators if some refused, and the result SAYS so) -> <out>/<release>.json, .csv, .png.
"""

from __future__ import annotations

import csv
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from secure_release.curator.service import CIPHER_OF_PB
from secure_release.infra.config import JsonLog, with_retries
from secure_release.infra.tls import secure_channel
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.keys import PadKey
from secure_release.mechanism.packing import unpack_symbols
from secure_release.mechanism.pads import CipherMode, ReleasePad
from secure_release.mechanism.plan import ReleasePlan
from secure_release.mechanism.protocol import ReleaseEstimate, researcher_decrypt, researcher_estimate
from secure_release.mechanism.schema import Attribute, CuratorSchema, JointSchema, SymbolArray
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc


class FetchError(SecureReleaseError):
    """The perturbed data failed its digest check or the release is not ready."""


class NoKeysError(SecureReleaseError):
    """No curator granted its key: nothing can be estimated."""


@dataclass
class Connection:
    certs: str | None
    name: str
    insecure: bool
    server: str
    curators: Mapping[str, str]  # name -> HOST:PORT

    def channel(self, address: str) -> grpc.Channel:
        return secure_channel(address, self.certs, self.name, self.insecure)  # type: ignore[arg-type]


def wait_perturbed(conn: Connection, release_id: str, timeout: float, log: JsonLog) -> pb.ReleaseStatus:
    deadline = time.monotonic() + timeout
    with conn.channel(conn.server) as ch:
        stub = pb_grpc.ReleaseServerStub(ch)
        while True:
            try:
                status = stub.GetReleaseStatus(pb.ReleaseStatusRequest(release_id=release_id), timeout=10)
                if status.state == pb.RELEASE_STATE_PERTURBED:
                    return status
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    raise
            if time.monotonic() > deadline:
                raise FetchError(f"release {release_id!r} not perturbed after {timeout:.0f}s")
            time.sleep(0.3)


def fetch_perturbed(conn: Connection, status: pb.ReleaseStatus, log: JsonLog) -> list[SymbolArray]:
    params = status.params
    sizes = [int(k) for k in params.alphabet_sizes]

    def once() -> list[SymbolArray]:
        parts: list[list[bytes]] = [[] for _ in sizes]
        h_rows, h_cols = hashlib.sha256(), [hashlib.sha256() for _ in sizes]
        digest = b""
        with conn.channel(conn.server) as ch:
            for chunk in pb_grpc.ReleaseServerStub(ch).FetchPerturbed(
                pb.FetchRequest(release_id=params.release_id), timeout=300
            ):
                if len(chunk.columns) != len(sizes):
                    raise FetchError(f"chunk {chunk.sequence} has {len(chunk.columns)} columns")
                for j, col in enumerate(chunk.columns):
                    parts[j].append(col)
                    h_rows.update(col)
                    h_cols[j].update(col)
                if chunk.last:
                    digest = chunk.digest
        col_major = hashlib.sha256(b"".join(h.digest() for h in h_cols)).digest()
        expected = [d for d in (digest, status.perturbed_digest) if d]
        if not expected:
            raise FetchError("the server sent no digest of the perturbed rows")
        ok = all(d in (h_rows.digest(), col_major) for d in expected)
        if not ok:
            raise FetchError("perturbed rows fail their digest check; refusing to estimate")
        cols = [unpack_symbols(b"".join(p), k) for p, k in zip(parts, sizes, strict=True)]
        if any(c.size != params.m for c in cols):
            raise FetchError(f"expected {params.m} perturbed rows per curator")
        return cols

    cols = with_retries(once, "fetch_perturbed", log)
    log("fetched", release_id=params.release_id, rows=int(params.m))
    return cols


@dataclass
class KeyResult:
    curator: str
    pad: ReleasePad | None
    schema: CuratorSchema | None
    refusal: str | None


def fetch_key(conn: Connection, curator: str, params: pb.ReleaseParams, log: JsonLog) -> KeyResult:
    address = conn.curators.get(curator)
    if address is None:
        return KeyResult(
            curator,
            None,
            None,
            f"no address for curator {curator!r} (--curator {curator}=HOST:PORT)",
        )

    def once() -> KeyResult:
        head: pb.KeyChunk | None = None
        otp: list[bytes] = []
        with conn.channel(address) as ch:
            for chunk in pb_grpc.CuratorStub(ch).ReleaseKey(pb.KeyRequest(release_id=params.release_id), timeout=60):
                head = head or chunk
                otp.append(chunk.otp_pad)
        if head is None:
            raise FetchError(f"{curator} sent no key")
        k, m = int(head.alphabet_size), int(head.m)
        idx = list(params.curators).index(curator)
        if k != params.alphabet_sizes[idx] or m != params.m or head.curator != curator:
            raise FetchError(f"{curator}'s key does not match the release parameters")
        mode = CIPHER_OF_PB[head.cipher]
        if mode is CipherMode.CHACHA20:
            pad = ReleasePad(mode, k, m, key=PadKey(head.chacha20_key))
        else:
            pad = ReleasePad(mode, k, m, pad_symbols=unpack_symbols(b"".join(otp), k))
        schema = CuratorSchema(
            head.schema.curator or curator,
            tuple(Attribute(a.name, tuple(a.categories)) for a in head.schema.attributes),
        )
        if schema.alphabet_size != k:
            raise FetchError(f"{curator}'s schema has {schema.alphabet_size} symbols, not {k}")
        return KeyResult(curator, pad, schema, None)

    try:
        res = with_retries(once, f"key_{curator}", log, attempts=5)
    except grpc.RpcError as exc:
        code = exc.code()
        if code in (
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.UNAUTHENTICATED,
        ):
            log("key_refused", curator=curator, code=str(code))
            return KeyResult(curator, None, None, f"{code.name}: {exc.details()}")
        raise
    log("key_received", curator=curator)
    return res


def plan_of(params: pb.ReleaseParams) -> ReleasePlan:
    return ReleasePlan(
        int(params.n),
        int(params.m),
        tuple(int(k) for k in params.alphabet_sizes),
        float(params.epsilon),
        float(params.gamma),
    )


def estimate_release(
    perturbed: Sequence[SymbolArray], params: pb.ReleaseParams, keys: Sequence[KeyResult]
) -> tuple[ReleaseEstimate, list[int]]:
    subset = [j for j, k in enumerate(keys) if k.pad is not None]
    if not subset:
        raise NoKeysError("no curator granted its key; nothing can be estimated")
    pads = [keys[j].pad for j in subset]
    decrypted = researcher_decrypt([perturbed[j] for j in subset], pads)  # type: ignore[arg-type]
    return researcher_estimate(decrypted, plan_of(params), subset), subset


def result_dict(
    release_id: str,
    params: pb.ReleaseParams,
    est: ReleaseEstimate,
    subset: Sequence[int],
    keys: Sequence[KeyResult],
) -> dict[str, Any]:
    schemas = [keys[j].schema for j in subset]
    known = tuple(s for s in schemas if s is not None)
    if len(known) != len(schemas):
        raise NoKeysError("a granting curator sent no schema; cannot label the cells")
    joint = JointSchema(known)
    names = joint.attribute_names
    cells = []
    for c, cell in enumerate(joint.cell_labels()):
        labels = list(cell)
        cells.append(
            {
                "labels": labels,
                "estimate": float(est.raw[c]),
                "projected": float(est.projected[c]),
                "mle": float(est.mle[c]),
                "standard_error": float(est.standard_errors[c]),
                "ci_low": float(est.ci_low[c]),
                "ci_high": float(est.ci_high[c]),
                "observed": int(est.counts[c]),
            }
        )
    report = plan_of(params).report()
    curators = list(params.curators)
    refused = {k.curator: k.refusal for k in keys if k.refusal}
    marginal = bool(est.is_marginal)
    return {
        "release_id": release_id,
        "marginal": marginal,
        "note": (
            "MARGINAL ONLY: curators " + ", ".join(sorted(refused)) + " did not grant their keys; "
            "the cells cover only " + ", ".join(curators[j] for j in subset)
        )
        if marginal
        else "joint estimate over every curator",
        "refused": refused,
        "curators": [curators[j] for j in subset],
        "attributes": names,
        "cells": cells,
        "privacy": report,
        "mle_iterations": int(est.mle_iterations),
    }


def write_outputs(out: Path, result: dict[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    rid = result["release_id"]
    paths = [out / f"{rid}.json", out / f"{rid}.csv"]
    tmp = paths[0].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(paths[0])
    with paths[1].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                *result["attributes"],
                "estimate",
                "projected",
                "mle",
                "standard_error",
                "ci_low",
                "ci_high",
                "observed",
            ]
        )
        for c in result["cells"]:
            w.writerow(
                [
                    *c["labels"],
                    c["estimate"],
                    c["projected"],
                    c["mle"],
                    c["standard_error"],
                    c["ci_low"],
                    c["ci_high"],
                    c["observed"],
                ]
            )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths
    cells = result["cells"]
    fig, ax = plt.subplots(figsize=(8, max(3, 0.25 * len(cells))))
    vals = np.array([[c["projected"]] for c in cells])
    ax.imshow(vals, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(cells)), [" / ".join(c["labels"]) for c in cells], fontsize=7)
    ax.set_xticks([0], ["projected share"])
    ax.set_title(
        f"{rid}: {'marginal' if result['marginal'] else 'joint'} estimate, eps={result['privacy']['epsilon']:.3g}"
    )
    fig.tight_layout()
    png = out / f"{rid}.png"
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return [*paths, png]


def process_release(
    conn: Connection, release_id: str, out: Path | None, log: JsonLog, timeout: float = 300.0
) -> dict[str, Any]:
    status = wait_perturbed(conn, release_id, timeout, log)
    perturbed = fetch_perturbed(conn, status, log)
    keys = [fetch_key(conn, c, status.params, log) for c in status.params.curators]
    est, subset = estimate_release(perturbed, status.params, keys)
    result = result_dict(release_id, status.params, est, subset, keys)
    if est.is_marginal:
        log("marginal_only", release_id=release_id, refused=sorted(result["refused"]))
    if out is not None:
        write_outputs(out, result)
    log("estimated", release_id=release_id, marginal=result["marginal"], cells=len(result["cells"]))
    return result
