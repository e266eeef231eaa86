"""An analyst's client of the researcher service (mutual TLS, the analyst's own certificate).

The researcher serves estimates only to the analysts it names with ``--analyst NAME``; the
client pins the service's role (``researcher``) before it sends anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from secure_release.mechanism.plan import ReleasePlan
from secure_release.mechanism.report import ReleaseReport


def _channel(address: str, certs: Path | None, name: str, insecure: bool = False) -> Any:
    """A channel that talks only to a service holding a ``researcher`` certificate."""
    from secure_release.infra.tls import secure_channel

    return secure_channel(address, certs, name, insecure, "analyst" if insecure else None, peer_role="researcher")


def report_from_pb(resp: Any) -> ReleaseReport:
    """An ``EstimateResponse`` as a :class:`ReleaseReport`.

    The wire carries K but not each curator's alphabet size, nor the curators that refused
    their keys: the plan gets one alphabet of size K (n, m, K, epsilon and gamma are exact) and
    a marginal estimate names its missing curators ``(refused)``.
    """
    import numpy as np

    p = resp.privacy
    plan = ReleasePlan(int(p.n), int(p.m), (int(p.joint_size),), float(p.epsilon), float(p.gamma))
    cells = list(resp.cells)

    def column(attr: str, dtype: type) -> Any:
        return np.fromiter((getattr(c, attr) for c in cells), dtype=dtype, count=len(cells))

    covered = tuple(resp.curators)
    refused = {"(refused)": "not granted"} if resp.marginal else {}
    return ReleaseReport(
        release_id=resp.release_id,
        plan=plan,
        curators=covered + tuple(refused),
        covered=covered,
        attributes=tuple(resp.attributes),
        labels=tuple(tuple(c.labels) for c in cells),
        estimate=column("estimate", np.float64),
        projected=column("projected", np.float64),
        mle=column("mle", np.float64),
        standard_error=column("standard_error", np.float64),
        ci_low=column("ci_low", np.float64),
        ci_high=column("ci_high", np.float64),
        observed=column("observed", np.int64),
        mle_iterations=int(resp.mle_iterations),
        interval_method=resp.interval_method,
        refused=refused,
    )


def fetch_report(
    address: str, certs: Path | None, name: str, release_id: str, wait: bool = True, timeout: float = 300.0,
    insecure: bool = False,
) -> ReleaseReport:  # fmt: skip
    """The estimate of ``release_id`` from the researcher service at ``address``."""
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    with _channel(address, certs, name, insecure) as ch:
        request = pb.EstimateRequest(release_id=release_id, wait=wait)
        resp = pb_grpc.ResearcherStub(ch).GetEstimate(request, timeout=timeout)
    return report_from_pb(resp)


def list_releases(
    address: str, certs: Path | None, name: str, timeout: float = 30.0, insecure: bool = False
) -> list[str]:
    """The ids of the releases the researcher service has estimated."""
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    with _channel(address, certs, name, insecure) as ch:
        return list(pb_grpc.ResearcherStub(ch).ListReleases(pb.ListReleasesRequest(), timeout=timeout).release_ids)
