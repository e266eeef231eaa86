"""The agreement step, leader and follower behind one function :func:`agree`.

The leader collects every curator's tags (:class:`~secure_release.curator.leader.LeaderState`)
and fixes spec, seed and common tags with ``mechanism.protocol.leader_agree``; a follower sends
its tags to the leader and fetches the agreement. Either way the curator then checks the spec
against its own settings (:func:`spec_differences`) before it samples anything.
"""

from __future__ import annotations

from dataclasses import replace

import grpc

from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import AgreementError, AlphabetSizeMismatchError, SpecRefusedError
from secure_release.curator.leader import LeaderState
from secure_release.curator.waits import Deadline, retry_until
from secure_release.infra.logs import EventLog
from secure_release.infra.tls import secure_channel
from secure_release.infra.wire import spec_from_pb, tag_chunks, tags_from_bytes
from secure_release.mechanism.alignment import TagArray
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.keys import Seed
from secure_release.mechanism.plan import plan_release
from secure_release.mechanism.protocol import Agreement
from secure_release.mechanism.spec import ReleaseSpec
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

SUBMIT_TIMEOUT_S = 60.0
AGREEMENT_CALL_S = 5.0  # one GetAgreement call waits this long at most (then asks again)


def leader_state(config: CuratorConfig, own_size: int) -> LeaderState:
    """The leader's collector for this release (its own size cross-checked against
    ``--alphabet-sizes`` at once, before anything is sent)."""
    sizes = config.expected_sizes
    if sizes is not None and sizes[config.curators.index(config.name)] != own_size:
        raise AlphabetSizeMismatchError(
            f"--alphabet-sizes gives {config.name} size {sizes[config.curators.index(config.name)]}, "
            f"its schema has {own_size}"
        )
    return LeaderState(
        config.release_id,
        config.curators,
        sizes,
        config.epsilon,
        config.m,
        config.cipher,
        config.researchers,
        seed=config.test_seed,
    )


def spec_differences(config: CuratorConfig, own_size: int, spec: ReleaseSpec, common_count: int) -> list[str]:
    """How the leader's ``spec`` differs from the spec this curator expects, readable ([] if
    none): same release id, curators and cipher, this curator's alphabet size, n = the number
    of common tags, our epsilon, our m (if we set one) and gamma by Eq. (2)."""
    sizes = list(spec.plan.alphabet_sizes)
    if config.name in spec.curators:
        sizes[spec.curators.index(config.name)] = own_size
    m = spec.m if config.m is None else config.m
    try:
        plan = plan_release(common_count, sizes, config.epsilon, m)
    except SecureReleaseError as exc:
        return [f"plan ({type(exc).__name__}: {exc})"]
    ours = ReleaseSpec(config.release_id, config.curators, config.cipher, plan, spec.researchers)
    return ours.differences(spec)


def check_agreement(config: CuratorConfig, own_size: int, agreement: Agreement) -> Agreement:
    """The agreement, with its spec's researchers replaced by this curator's own (what it
    registers at the server); :class:`AgreementError` if the leader's spec differs from ours."""
    problems = spec_differences(config, own_size, agreement.spec, int(agreement.common.size))
    spec = replace(agreement.spec, researchers=config.researchers)
    if problems:
        raise SpecRefusedError(f"the leader's release spec differs from ours: {'; '.join(problems)}", spec)
    return agreement._replace(spec=spec)


def _fetch_agreement(stub: pb_grpc.CuratorStub, config: CuratorConfig, timeout: float) -> Agreement:
    request = pb.AgreementRequest(release_id=config.release_id, curator=config.name)
    first: pb.AgreementChunk | None = None
    pieces: list[bytes] = []
    for seq, chunk in enumerate(stub.GetAgreement(request, timeout=timeout)):
        if chunk.sequence != seq:
            raise AgreementError(f"the leader sent agreement chunk {chunk.sequence} where {seq} was due")
        first = first or chunk
        pieces.append(chunk.common_tags)
    if first is None:
        raise AgreementError("the leader sent no agreement")
    return Agreement(spec_from_pb(first.params), Seed(first.sampling_seed), tags_from_bytes(b"".join(pieces)))


def follow_leader(config: CuratorConfig, tags: TagArray, own_size: int, log: EventLog, deadline: Deadline) -> Agreement:
    """Send this curator's tags and alphabet size to the leader, then fetch the agreement (both
    retried while the leader is unreachable or not ready, until ``deadline``). A refusal by the
    leader (FAILED_PRECONDITION, PERMISSION_DENIED, ...) arrives at once as :class:`AgreementError`."""
    assert config.leader_address is not None
    leader = config.curators[0]  # the leader comes first: the handshake fails against any other peer
    channel = secure_channel(
        config.leader_address,
        config.certs,
        config.name,
        config.insecure,
        role="curator",
        peer_role="curator",
        peer_name=leader,
    )
    try:
        stub = pb_grpc.CuratorStub(channel)

        def submit(timeout: float) -> pb.SubmitTagsResponse:
            resp: pb.SubmitTagsResponse = stub.SubmitTags(
                tag_chunks(config.release_id, config.name, tags, own_size), timeout=timeout
            )
            log("tags_submitted", leader=config.leader_address, tags=int(resp.tags_received))
            return resp

        def fetch(timeout: float) -> Agreement:
            try:
                return _fetch_agreement(stub, config, timeout)
            except grpc.RpcError as exc:
                if "TagsMissingError" in (exc.details() or ""):  # the leader restarted: send again
                    submit(min(timeout, SUBMIT_TIMEOUT_S))
                raise

        retry_until(
            submit, f"the leader {leader} at {config.leader_address} to take our tags", deadline, log,
            per_call_s=SUBMIT_TIMEOUT_S,
        )  # fmt: skip
        return retry_until(
            fetch,
            f"the agreement of the leader {leader}",
            deadline,
            log,
            per_call_s=AGREEMENT_CALL_S,
        )
    except grpc.RpcError as exc:
        raise AgreementError(f"the leader {leader} refused: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()


def agree(
    config: CuratorConfig, tags: TagArray, own_size: int, state: LeaderState | None, log: EventLog, deadline: Deadline
) -> Agreement:
    """Step 1, leader (``state`` given; a restored agreement is reused) or follower: the
    checked (spec, seed, common tags)."""
    if state is not None and state.agreement is not None:
        agreement = state.agreement
    elif state is not None:
        state.add_tags(config.name, tags, own_size)
        agreement = state.collect(deadline.check("the tags of every curator"))
    else:
        agreement = follow_leader(config, tags, own_size, log, deadline)
    agreement = check_agreement(config, own_size, agreement)
    log(
        "agreed",
        release_id=config.release_id,
        n=agreement.spec.n,
        m=agreement.spec.m,
        seed_fingerprint=agreement.seed.fingerprint,
    )
    return agreement
