"""Another curator's refusal of the release as the server shows it, asked for while a curator waits.

A curator that refuses before the agreement records its refusal at the server; a follower whose
leader is gone, or a leader whose follower could not reach it, reads it there
(:func:`server_refusal`, at most every :data:`REFUSAL_EVERY_S` through :class:`RefusalWatch`) and
ends its wait as refused.
"""

from __future__ import annotations

import time

import grpc

from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import ReleaseRefusedError
from secure_release.infra.tls import secure_channel
from secure_release.infra.wire import Refusal, refusals_from_pb
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

REFUSAL_CALL_S = 2.0  # one GetRefusals call to the server
REFUSAL_EVERY_S = 2.0  # how often a wait asks the server for another curator's refusal


def server_refusal(config: CuratorConfig) -> Refusal | None:
    """Another curator's refusal of this release as the server shows it (a refusal recorded
    before the agreement: no budget, a data check, a key, a seed; only one of ``--curators``);
    None if there is none, or the server cannot say. What a curator's wait reads when the refusing
    party cannot tell it directly (a leader gone, a follower that could not reach the leader)."""
    try:
        channel = secure_channel(config.server, config.certs, config.name, config.insecure,
                                 role="curator", peer_role="server")  # fmt: skip
    except Exception:  # best effort: the wait goes on
        return None
    try:
        answer = pb_grpc.ReleaseServerStub(channel).GetRefusals(
            pb.RefusalQuery(release_id=config.release_id), timeout=REFUSAL_CALL_S
        )
        refusals = refusals_from_pb(answer)
    except (grpc.RpcError, SecureReleaseError):
        return None
    finally:
        channel.close()
    return next((r for r in refusals if r.curator != config.name and r.curator in config.curators), None)


class RefusalWatch:
    """Asks the server for another curator's refusal at most every :data:`REFUSAL_EVERY_S`."""

    def __init__(self, config: CuratorConfig) -> None:
        self.config = config
        self.next_at = 0.0

    def __call__(self) -> Refusal | None:
        """The refusal the server shows, if it is time to ask and there is one."""
        now = time.monotonic()
        if now < self.next_at:
            return None
        self.next_at = now + REFUSAL_EVERY_S
        return server_refusal(self.config)

    def check(self) -> None:
        """:class:`ReleaseRefusedError` (exit 3) naming the refusing curator and the reason
        class, if the server shows a refusal."""
        refusal = self()
        if refusal is not None:
            raise ReleaseRefusedError(refusal.message())
