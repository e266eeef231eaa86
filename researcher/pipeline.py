"""One release, start to finish, as a typed :class:`~secure_release.mechanism.estimation.report.ReleaseReport`.

wait until PERTURBED (ABORTED stops with the reason) -> fetch the perturbed rows (digest checked)
-> ask each curator for its key (unreachable curators again until the deadline) -> decrypt and
estimate with ``mechanism.protocol.in_memory`` -> write ``<out>/<release>.json``, ``.csv`` and ``.png``.

Without every key the release fails with :class:`MissingKeysError` naming the missing curators,
unless ``allow_partial``: then only the marginal of the granting curators is estimated and the
report says which curators are missing and why. One ``timeout`` covers the whole pipeline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from secure_release.infra.logs import EventLog
from secure_release.mechanism.analysis.design import Design
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.estimation.report import ReleaseEstimate, ReleaseReport, TablesReport, build_report
from secure_release.mechanism.protocol.in_memory import estimate_from_counts, researcher_decrypt, researcher_estimate
from secure_release.mechanism.protocol.spec import ReleaseSpec, check_name, designed_spec
from secure_release.mechanism.protocol.tables import TablesPlan, table_plan, tables_report
from secure_release.mechanism.schema import JointSchema, SymbolArray
from secure_release.researcher.client import (
    Endpoints,
    FetchDeadline,
    KeyResults,
    PerturbedRelease,
    acknowledge_keys,
    count_perturbed,
    count_tables,
    fetch_keys,
    wait_perturbed,
)
from secure_release.researcher.errors import NoKeysError, ReleaseDesignMismatchError
from secure_release.researcher.storage import AnyReport, write_report


class MissingKeysError(SecureReleaseError):
    """Some curator's key is missing (refused or unreachable) and a partial estimate was not
    allowed (``--allow-partial``)."""

    kind = ErrorKind.FAILED_PRECONDITION


def check_complete(spec: ReleaseSpec, keys: KeyResults, allow_partial: bool) -> None:
    """:class:`MissingKeysError` unless every curator's key arrived or ``allow_partial``."""
    missing = keys.missing()
    if missing and not allow_partial:
        if spec.tables:
            raise MissingKeysError(
                f"release {spec.release_id!r}: no tables without every curator's key; missing "
                f"{dict(sorted(missing.items()))}; pass --allow-partial for the tables the others hold alone"
            )
        raise MissingKeysError(
            f"release {spec.release_id!r}: no joint estimate without every curator's key; missing "
            f"{dict(sorted(missing.items()))}; pass --allow-partial for the marginal of the others"
        )


def estimate_release(spec: ReleaseSpec, perturbed: Sequence[SymbolArray], keys: KeyResults) -> ReleaseReport:
    """Decrypt the granted curators' columns and estimate their joint type (the whole joint if
    every curator granted, else their marginal), labelled with their schemas."""
    granted = granted_columns(spec, keys)
    curator_keys = [keys.granted[spec.curators[j]] for j in granted]
    decrypted = researcher_decrypt([perturbed[j] for j in granted], [k.pad for k in curator_keys])
    estimate = researcher_estimate(decrypted, spec.plan, granted)
    schema = JointSchema(tuple(k.schema for k in curator_keys))
    return build_report(spec.release_id, spec.plan, spec.curators, estimate, schema, keys.missing())


def granted_columns(spec: ReleaseSpec, keys: KeyResults) -> list[int]:
    """The columns whose curators granted their key (:class:`NoKeysError` if none did)."""
    granted = [j for j, curator in enumerate(spec.curators) if curator in keys.granted]
    if not granted:
        raise NoKeysError(
            f"no curator of release {spec.release_id!r} granted its key ({keys.missing()}); "
            "a curator must --grant this researcher before anything can be estimated"
        )
    return granted


def estimate_streamed(
    endpoints: Endpoints, release: PerturbedRelease, keys: KeyResults, log: EventLog, notified_digest: bytes = b""
) -> ReleaseReport:
    """:func:`estimate_release` with the perturbed rows decrypted and counted chunk by chunk as
    they arrive (the researcher's memory is flat in m), then the estimate from the counts."""
    spec = release.spec
    granted = granted_columns(spec, keys)
    curator_keys = [keys.granted[spec.curators[j]] for j in granted]
    pads = {j: k.pad for j, k in zip(granted, curator_keys, strict=True)}
    counts = count_perturbed(endpoints, release, pads, log, notified_digest)
    estimate = estimate_from_counts(counts, spec.plan, granted)
    schema = JointSchema(tuple(k.schema for k in curator_keys))
    return build_report(spec.release_id, spec.plan, spec.curators, estimate, schema, keys.missing())


def check_design(spec: ReleaseSpec, keys: KeyResults) -> Design:
    """The design the curators sent with their keys (each checked against the spec's digest by
    ``client``), checked to make this release: the spec its curators agreed (tables, m, epsilon,
    alphabets at the release's n, as ``protocol.spec.designed_spec`` gives), and each granted curator's
    schema the design's; :class:`ReleaseDesignMismatchError` otherwise."""
    rid = spec.release_id
    try:
        design = Design.from_dict(json.loads(next(k.design for k in keys.granted.values())))
        plan = TablesPlan(design.schemas, tuple(design.planned_tables()), design.epsilon, design.n, spec.design_digest)
        ours = designed_spec(rid, spec.curators, spec.cipher, spec.n, plan, spec.researchers)
    except (SecureReleaseError, ValueError, KeyError, TypeError) as exc:
        raise ReleaseDesignMismatchError(
            f"release {rid!r}: the design {spec.design_digest} does not make a release of curators "
            f"{list(spec.curators)} at n = {spec.n} ({type(exc).__name__}: {exc})"
        ) from None
    differences = ours.differences(spec)
    if differences:
        raise ReleaseDesignMismatchError(
            f"release {rid!r}: the spec the server holds is not the one design {spec.design_digest} gives at "
            f"n = {spec.n}: {'; '.join(differences)}"
        )
    for curator, key in keys.granted.items():
        if key.schema.attributes != plan.schema_of(curator).attributes:
            raise ReleaseDesignMismatchError(
                f"release {rid!r}: {curator}'s key labels its symbols with another schema than design "
                f"{spec.design_digest} holds for it"
            )
    return design


def estimate_tables(
    endpoints: Endpoints, release: PerturbedRelease, keys: KeyResults, log: EventLog, notified_digest: bytes = b""
) -> TablesReport:
    """A release of several tables: each table estimated from its counts as a release of its own
    (n, m_t, gamma_t), labelled with its curators' attributes in it; a table with a curator whose
    key is missing is not estimated (None; ``missing`` says whose and why), as
    ``in_memory.run_tables_release`` with ``granted``."""
    spec = release.spec
    granted = granted_columns(spec, keys)
    design = check_design(spec, keys)
    why = keys.missing()
    missing: dict[int, str] = {}
    for t, layout in enumerate(spec.tables):
        absent = [spec.curators[j] for j in layout.live if j not in granted]
        if absent:
            missing[t] = "no key from " + "; ".join(f"{c} ({why.get(c, 'not granted')})" for c in absent)
    pads = {j: keys.granted[spec.curators[j]].pad for j in granted}
    counts = count_tables(endpoints, release, pads, log, notified_digest)
    estimates: list[ReleaseEstimate | None] = [
        None if t in missing else estimate_from_counts(c, table_plan(spec.n, spec.plan.epsilon, layout))
        for t, (layout, c) in enumerate(zip(spec.tables, counts, strict=True))
    ]
    if missing:
        log.warning("tables_not_estimated", release_id=spec.release_id,
                    tables=",".join(str(t + 1) for t in sorted(missing)), refused=",".join(sorted(why)))  # fmt: skip
    schemas = {c: k.schema for c, k in keys.granted.items()}
    attributes = [a for a, _, _ in design.planned_tables()]
    sent = json.loads(next(k.design for k in keys.granted.values()))  # the design as the curators sent it
    return tables_report(spec.release_id, spec.curators, spec.n, spec.plan.epsilon, spec.tables, attributes,
                         schemas, estimates, sent, spec.design_digest, missing)  # fmt: skip


def process_release(
    endpoints: Endpoints,
    release_id: str,
    out: Path | None,
    log: EventLog,
    timeout: float,
    notified_digest: bytes = b"",
    allow_partial: bool = True,
) -> AnyReport:
    """Estimate ``release_id`` and (if ``out``) write its files; nothing is written on failure.
    ``timeout`` seconds cover everything; a missing key fails it unless ``allow_partial``."""
    check_name(release_id, "release id")
    deadline = FetchDeadline(timeout)
    release = wait_perturbed(endpoints, release_id, deadline)
    keys = fetch_keys(endpoints, release.spec, log, deadline)
    check_complete(release.spec, keys, allow_partial)
    if release.spec.tables:
        return _finish_tables(endpoints, estimate_tables(endpoints, release, keys, log, notified_digest), out, keys,
                              log)  # fmt: skip
    report = estimate_streamed(endpoints, release, keys, log, notified_digest)
    if report.marginal:
        log.warning("marginal_only", release_id=release_id, refused=",".join(sorted(report.refused)))
    if out is not None:
        paths = write_report(out, report)  # atomic and fsynced: the result is durable now
        log("written", release_id=release_id, files=",".join(p.name for p in paths),
            note=f"result of {release_id} written: {', '.join(str(p) for p in paths)}")  # fmt: skip
        acknowledge_keys(endpoints, release_id, keys.granted, log)  # only now: a crash before finds the keys
    scope = "a marginal" if report.marginal else "the joint table"
    log("estimated", release_id=release_id, marginal=report.marginal, cells=len(report.labels),
        note=f"estimated {release_id}: {scope} of {len(report.labels)} cells, m={report.plan.m}, "
             f"epsilon {report.plan.epsilon:g}")  # fmt: skip
    return report


def _finish_tables(
    endpoints: Endpoints, report: TablesReport, out: Path | None, keys: KeyResults, log: EventLog
) -> TablesReport:
    """Write a release of several tables (if ``out``), acknowledge the keys, log it."""
    rid = report.release_id
    if out is not None:
        paths = write_report(out, report)
        log("written", release_id=rid, files=",".join(p.name for p in paths),
            note=f"result of {rid} written: {', '.join(str(p) for p in paths)}")  # fmt: skip
        acknowledge_keys(endpoints, rid, keys.granted, log)
    done = sum(t is not None for t in report.tables)
    note = f"estimated {rid}: {done} of {len(report.tables)} tables, epsilon {report.epsilon:.6g} (Eq. T1)"
    log("estimated", release_id=rid, tables=len(report.tables), note=note)
    return report
