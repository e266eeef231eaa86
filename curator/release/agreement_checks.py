"""What a curator accepts of the leader's agreement, checked before it samples anything.

:func:`check_agreement` compares the agreed spec and the sampling and alignment modes with this
curator's own settings (:func:`spec_differences`; a release of a design's tables by its design,
:func:`design_differences`) and refuses any difference; :func:`own_alignment` gives this
curator's rows in the agreed order (a row order the leader sent is checked row by row).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import DesignRefusedError, SpecRefusedError
from secure_release.infra.streams import AgreementError
from secure_release.mechanism.alignment.keyed_hash import Alignment, RowOrder, SortedTags, TagArray, align
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.architectures import VariantAgreement
from secure_release.mechanism.protocol.spec import ReleaseSpec, designed_spec


def spec_differences(config: CuratorConfig, own_size: int, spec: ReleaseSpec, common_count: int) -> list[str]:
    """How the leader's ``spec`` differs from the spec this curator expects, readable ([] if
    none): same release id, curators and cipher, this curator's alphabet size, n = the number
    of common tags, our epsilon, our m (if we set one) and gamma by Eq. (2)."""
    if config.design is not None or spec.designed:  # a release of a design's tables: the same design, by digest
        return design_differences(config, spec, common_count)
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


def design_differences(config: CuratorConfig, spec: ReleaseSpec, common_count: int) -> list[str]:
    """How the leader's spec of a designed release differs from the one this curator's own design
    gives for the same n (first of all the design's digest: both are named)."""
    mine = config.design.digest if config.design is not None else "none (no --design)"
    theirs = spec.design_digest or "none (the whole joint, no --design)"
    if mine != theirs:
        return [f"design (the leader runs design {theirs}, this curator design {mine})"]
    assert config.design is not None
    try:
        ours = designed_spec(config.release_id, config.curators, config.cipher, common_count, config.design,
                             spec.researchers)  # fmt: skip
    except SecureReleaseError as exc:
        return [f"plan of the design's tables ({type(exc).__name__}: {exc})"]
    return ours.differences(spec)


def check_agreement(config: CuratorConfig, own_size: int, agreement: VariantAgreement) -> VariantAgreement:
    """The agreement, with its spec's researchers replaced by this curator's own (what it
    registers at the server); :class:`SpecRefusedError` if the leader's spec or its sampling or
    alignment mode differs from ours; :class:`DesignRefusedError` (a refusal: exit 3 at every
    party) if either runs a design (``--design``) and the spec is not what this curator's design
    gives for the agreed n (another digest, none, or other tables)."""
    base = agreement.base
    differences = spec_differences(config, own_size, base.spec, agreement.num_common)
    problems = list(differences)
    if agreement.sampling is not config.sampling:
        problems.append(f"sampling ({agreement.sampling.value!r} != {config.sampling.value!r})")
    if agreement.alignment is not config.alignment:
        problems.append(f"alignment ({agreement.alignment.value!r} != {config.alignment.value!r})")
    spec = replace(base.spec, researchers=config.researchers)
    if differences and (config.design is not None or base.spec.designed):
        mine = config.design.digest if config.design is not None else "none (no --design)"
        theirs = base.spec.design_digest or "none (no --design)"
        raise DesignRefusedError(
            f"the leader's release spec is not this curator's design (the leader's design {theirs}, this "
            f"curator's design {mine}): {'; '.join(problems)}",
            spec,
        )
    if problems:
        raise SpecRefusedError(f"the leader's release spec differs from ours: {'; '.join(problems)}", spec)
    return replace(agreement, base=base._replace(spec=spec))


def own_alignment(
    agreement: VariantAgreement, own_tags: TagArray, presorted: SortedTags | None = None,
    leader_rows: RowOrder | None = None,
) -> Alignment:  # fmt: skip
    """This curator's rows in the canonical order: as the leader sent them (a follower: each
    must be one of its rows, none twice, n in all), as the leader computed them for itself, or
    (an agreement that carries the common tags) by matching its own tags against them."""
    rows = agreement.own_rows if agreement.own_rows is not None else leader_rows
    if rows is None:
        return align(own_tags, agreement.base.common, presorted)
    num_rows = int(own_tags.size)
    seen = np.zeros(num_rows, dtype=bool)
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= num_rows):
        raise AgreementError(f"the leader's row order names a row outside this curator's {num_rows} rows")
    seen[rows] = True
    if int(np.count_nonzero(seen)) != rows.size or rows.size != agreement.num_common:
        raise AgreementError("the leader's row order names a row twice, or not n rows")
    return Alignment(rows.astype(np.int64, copy=False), num_rows, int(rows.size))
