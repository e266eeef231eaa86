"""An analyst's client of the researcher service (mutual TLS, the analyst's own certificate).

The researcher serves estimates only to the analysts it names with ``--analyst NAME``; the
client pins the service's role (``researcher``) before it sends anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from secure_release.infra.wire import report_from_pb, tables_report_from_pb
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.estimation.report import ReleaseReport, TablesReport


def _channel(address: str, certs: Path | None, name: str, insecure: bool = False) -> Any:
    """A channel that talks only to a service holding a ``researcher`` certificate."""
    from secure_release.infra.tls import secure_channel

    return secure_channel(address, certs, name, insecure, "analyst" if insecure else None, peer_role="researcher")


#: How long ``fetch_report`` waits for the researcher service to accept a connection.
CONNECT_S = 10.0


class ResearcherUnreachableError(SecureReleaseError):
    """The researcher service at --researcher does not accept a connection."""

    kind = ErrorKind.UNAVAILABLE


def fetch_report(
    address: str, certs: Path | None, name: str, release_id: str, wait: bool = True, timeout: float = 300.0,
    insecure: bool = False,
) -> ReleaseReport | TablesReport:  # fmt: skip
    """The estimate of ``release_id`` from the researcher service at ``address`` (a release of
    several tables: its :class:`TablesReport`)."""
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    with _channel(address, certs, name, insecure) as ch:
        if wait:  # a researcher that is still starting is waited for, briefly; a wrong address is said
            try:
                grpc.channel_ready_future(ch).result(timeout=min(CONNECT_S, timeout))
            except grpc.FutureTimeoutError:
                raise ResearcherUnreachableError(
                    f"cannot reach the researcher at {address} (--researcher) within {min(CONNECT_S, timeout):g} s"
                ) from None
        request = pb.EstimateRequest(release_id=release_id, wait=wait)
        resp = pb_grpc.ResearcherStub(ch).GetEstimate(request, timeout=timeout)
    tables = tables_report_from_pb(resp)
    return tables if tables is not None else report_from_pb(resp)


def list_releases(
    address: str, certs: Path | None, name: str, timeout: float = 30.0, insecure: bool = False
) -> list[str]:
    """The ids of the releases the researcher service has estimated."""
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    with _channel(address, certs, name, insecure) as ch:
        return list(pb_grpc.ResearcherStub(ch).ListReleases(pb.ListReleasesRequest(), timeout=timeout).release_ids)
