"""The Researcher gRPC service.

- ``NotifyReady`` (server role only): the release is perturbed; start processing it.
- ``GetEstimate`` (analyst or researcher role): the finished estimate (cells labelled from the
  curators' schemas, raw / projected / MLE / SE / CI, privacy report, marginal flag). With
  ``wait`` it blocks until the estimate exists (and starts processing if nobody notified us).
- ``ListReleases``: the releases estimated so far.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import grpc

from secure_release.infra.config import JsonLog
from secure_release.infra.tls import require_role
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.pipeline import Connection, process_release


def response_of(result: dict[str, Any]) -> pb.EstimateResponse:
    p = result["privacy"]
    return pb.EstimateResponse(
        release_id=result["release_id"],
        marginal=result["marginal"],
        curators=result["curators"],
        attributes=result["attributes"],
        cells=[
            pb.Cell(
                labels=c["labels"],
                estimate=c["estimate"],
                projected=c["projected"],
                mle=c["mle"],
                standard_error=c["standard_error"],
                ci_low=c["ci_low"],
                ci_high=c["ci_high"],
                observed=c["observed"],
            )
            for c in result["cells"]
        ],
        privacy=pb.PrivacyReport(
            epsilon=p["epsilon"],
            gamma=p["gamma"],
            m=p["m"],
            n=p["n"],
            joint_size=p["K"],
            predicted_rmse=p["predicted_rmse"],
            bound=p["bound"],
            bound_tight=p["bound_tight"],
        ),
        mle_iterations=result["mle_iterations"],
    )


class ResearcherService(pb_grpc.ResearcherServicer):
    def __init__(self, conn: Connection, out: Path | None, log: JsonLog, timeout: float = 300.0) -> None:
        self.conn, self.out, self.log, self.timeout = conn, out, log, timeout
        self.results: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, str] = {}
        self.running: set[str] = set()
        self.cond = threading.Condition()
        if out is not None and out.is_dir():
            for path in out.glob("*.json"):
                try:
                    data = json.loads(path.read_text())
                    self.results[data["release_id"]] = data
                except (ValueError, KeyError):
                    continue

    def start(self, release_id: str) -> None:
        with self.cond:
            if release_id in self.running or release_id in self.results:
                return
            self.running.add(release_id)
            self.errors.pop(release_id, None)
        threading.Thread(target=self._process, args=(release_id,), daemon=True).start()

    def _process(self, release_id: str) -> None:
        try:
            result = process_release(self.conn, release_id, self.out, self.log, self.timeout)
            with self.cond:
                self.results[release_id] = result
        except Exception as exc:  # report, never crash the service
            self.log("process_failed", release_id=release_id, error=f"{type(exc).__name__}: {exc}")
            with self.cond:
                self.errors[release_id] = f"{type(exc).__name__}: {exc}"
        finally:
            with self.cond:
                self.running.discard(release_id)
                self.cond.notify_all()

    def NotifyReady(self, request: pb.ReadyNotice, context: grpc.ServicerContext) -> pb.ReadyAck:  # noqa: N802
        ident = require_role(context, "server")
        self.log("notified", release_id=request.release_id, by=str(ident))
        self.start(request.release_id)
        return pb.ReadyAck(accepted=True)

    def GetEstimate(  # noqa: N802
        self, request: pb.EstimateRequest, context: grpc.ServicerContext
    ) -> pb.EstimateResponse:
        require_role(context, "analyst", "researcher")
        rid = request.release_id
        if request.wait:
            self.start(rid)
            remaining = context.time_remaining()
            timeout = min(remaining, 3600.0) if remaining is not None else self.timeout
            with self.cond:
                self.cond.wait_for(
                    lambda: rid in self.results or (rid in self.errors and rid not in self.running),
                    timeout,
                )
        with self.cond:
            result, error = self.results.get(rid), self.errors.get(rid)
        if result is None:
            if error:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"release {rid!r} failed: {error}")
            context.abort(
                grpc.StatusCode.NOT_FOUND if not request.wait else grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no estimate for release {rid!r} yet",
            )
        return response_of(result)

    def ListReleases(  # noqa: N802
        self, request: pb.ListReleasesRequest, context: grpc.ServicerContext
    ) -> pb.ListReleasesResponse:
        require_role(context, "analyst", "researcher")
        with self.cond:
            return pb.ListReleasesResponse(release_ids=sorted(self.results))
