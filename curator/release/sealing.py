"""The seal step: wait until every curator committed its part (the release is SEALED or
PERTURBED), then commit this curator's reservation; ABORTED raises with the reason (the failure
paths refund it: :mod:`secure_release.curator.release.failing`)."""

from __future__ import annotations

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.release.budget import settle
from secure_release.curator.release.upload import ServerLink
from secure_release.infra.logs import EventLog
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb


def await_seal(release_id: str, keystore: Keystore, link: ServerLink, log: EventLog) -> pb.ReleaseStatus:
    """Wait until the release is sealed, then commit the ledger's reservation; the final status."""
    status = link.wait_sealed()
    settle(release_id, keystore, sealed=True, log=log)
    return status
