"""The agreement step, leader and follower behind one function :func:`agree`, and the leader's side.

The leader collects every curator's tags (:class:`~secure_release.curator.leader.LeaderState`,
made for the release by :func:`leader_state` and waited for by :func:`collect_tags`) and fixes
spec, sample (a seed, or with ``--sampling indices`` the packed index tuple) and common tags with
``mechanism.protocol.architectures.leader_agree_variant``; a follower sends its tags to the leader
and fetches the agreement (:mod:`~secure_release.curator.release.follower`). Either way the
curator then checks the spec and the modes against its own settings
(:mod:`~secure_release.curator.release.agreement_checks`) before it samples anything.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import AlphabetSizeMismatchError, ReleaseRefusedError, stopped_error
from secure_release.curator.leader import LeaderState
from secure_release.curator.release.agreement_checks import check_agreement
from secure_release.curator.release.follower import TagSource, follow_leader
from secure_release.curator.release.refusal_watch import RefusalWatch
from secure_release.curator.waits import Deadline
from secure_release.infra.logs import EventLog, peak_rss_mib
from secure_release.infra.streams import RowSink
from secure_release.infra.wire import Refusal
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE
from secure_release.mechanism.protocol.architectures import VariantAgreement, sample_fingerprint


def leader_state(config: CuratorConfig, own_size: int, kind: type[LeaderState] = LeaderState) -> LeaderState:
    """The leader's collector for this release (its own size cross-checked against
    ``--alphabet-sizes`` at once, before anything is sent)."""
    sizes = config.expected_sizes
    if sizes is not None and sizes[config.curators.index(config.name)] != own_size:
        raise AlphabetSizeMismatchError(
            f"--alphabet-sizes gives {config.name} size {sizes[config.curators.index(config.name)]}, "
            f"its schema has {own_size}"
        )
    return kind(
        config.release_id,
        config.curators,
        sizes,
        config.epsilon,
        config.m,
        config.cipher,
        config.researchers,
        seed=config.test_seed,
        sampling=config.sampling,
        alignment=config.alignment,
        max_points=config.max_rows,
        tables=config.design,
    )


def collect_tags(
    state: LeaderState, deadline: Deadline, step_s: float = 1.0, refused: Callable[[], Refusal | None] | None = None
) -> VariantAgreement:
    """The leader's agreement once every curator's tags arrived (:meth:`LeaderState.collect`),
    waited for in steps of ``step_s`` so that SIGTERM ends the wait within a step: the release
    is failed for every follower, then :class:`StoppedError`. (A single wait of the whole
    --timeout did not see SIGTERM: a leader whose follower died mid-ring stayed, with its
    workers, until its timeout.) ``refused``: a follower's refusal recorded at the server (one
    that could not reach the leader), which fails the release for every follower and raises
    :class:`ReleaseRefusedError`."""
    what = "the tags of every curator"
    while deadline.left() > step_s and not state.wait_all_tags(step_s):
        if state.error is not None:
            break  # collect raises it
        refusal = refused() if refused is not None else None
        if refusal is not None:
            state.mark_told(refusal.curator)  # it refused: nothing to tell it
            state.fail(refusal.message())
            raise ReleaseRefusedError(refusal.message())
        if deadline.stop.is_set():
            state.fail(f"the leader was {stopped_error(deadline.stop, 'while waiting for the tags')}")
            deadline.check(what)  # raises StoppedError
    return state.collect(deadline.check(what), waited=deadline.seconds)


def agree(
    config: CuratorConfig, tags: TagSource, own_size: int, state: LeaderState | None, log: EventLog, deadline: Deadline,
    rows_sink: RowSink | None = None,
) -> VariantAgreement:
    """Step 1, leader (``state`` given; a restored agreement is reused) or follower: the
    checked (spec, sample, common tags); a follower's row order goes to ``rows_sink`` if given."""  # fmt: skip
    if state is not None and state.agreement is not None:
        agreement = state.agreement
    elif state is not None:
        state.add_tags(config.name, tags if isinstance(tags, np.ndarray) else np.zeros(0, dtype=TAG_DTYPE), own_size)
        agreement = collect_tags(state, deadline, refused=RefusalWatch(config))
    else:
        agreement = follow_leader(config, tags, own_size, log, deadline, rows_sink)
    agreement = check_agreement(config, own_size, agreement)
    log(
        "agreed",
        release_id=config.release_id,
        n=agreement.base.spec.n,
        m=agreement.base.spec.m,
        sampling=agreement.sampling.value,
        alignment=agreement.alignment.value,
        sample_fingerprint=sample_fingerprint(agreement),
        sample_bytes=agreement.agreement_sample_bytes,
        peak_rss_mib=peak_rss_mib(),
    )
    return agreement
