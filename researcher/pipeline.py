"""One release, start to finish, as a typed :class:`~secure_release.mechanism.report.ReleaseReport`.

wait until PERTURBED -> fetch the perturbed rows (digest checked) -> ask each curator for its key
(a refusal is recorded, not fatal) -> decrypt and estimate with ``mechanism.protocol`` (only the
marginal of the granting curators if some refused, and the report says so) -> write
``<out>/<release>.json``, ``.csv`` and ``.png``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from secure_release.infra.logs import EventLog
from secure_release.mechanism.protocol import researcher_decrypt, researcher_estimate
from secure_release.mechanism.report import ReleaseReport, build_report
from secure_release.mechanism.schema import JointSchema, SymbolArray
from secure_release.mechanism.spec import ReleaseSpec, check_name
from secure_release.researcher.client import Endpoints, KeyResults, fetch_keys, fetch_perturbed, wait_perturbed
from secure_release.researcher.errors import NoKeysError
from secure_release.researcher.storage import write_report


def estimate_release(spec: ReleaseSpec, perturbed: Sequence[SymbolArray], keys: KeyResults) -> ReleaseReport:
    """Decrypt the granted curators' columns and estimate their joint type (the whole joint if
    every curator granted, else their marginal), labelled with their schemas."""
    granted = [j for j, curator in enumerate(spec.curators) if curator in keys.granted]
    if not granted:
        raise NoKeysError(
            f"no curator of release {spec.release_id!r} granted its key ({dict(keys.refused)}); "
            "a curator must --grant this researcher before anything can be estimated"
        )
    curator_keys = [keys.granted[spec.curators[j]] for j in granted]
    decrypted = researcher_decrypt([perturbed[j] for j in granted], [k.pad for k in curator_keys])
    estimate = researcher_estimate(decrypted, spec.plan, granted)
    schema = JointSchema(tuple(k.schema for k in curator_keys))
    return build_report(spec.release_id, spec.plan, spec.curators, estimate, schema, keys.refused)


def process_release(
    endpoints: Endpoints,
    release_id: str,
    out: Path | None,
    log: EventLog,
    timeout: float,
    notified_digest: bytes = b"",
) -> ReleaseReport:
    """Estimate ``release_id`` and (if ``out``) write its files; nothing is written on failure."""
    check_name(release_id, "release id")
    release = wait_perturbed(endpoints, release_id, timeout)
    perturbed = fetch_perturbed(endpoints, release, log, notified_digest)
    keys = fetch_keys(endpoints, release.spec, log)
    report = estimate_release(release.spec, perturbed, keys)
    if report.marginal:
        log.warning("marginal_only", release_id=release_id, refused=",".join(sorted(report.refused)))
    if out is not None:
        paths = write_report(out, report)
        log("written", release_id=release_id, files=",".join(p.name for p in paths))
    log("estimated", release_id=release_id, marginal=report.marginal, cells=len(report.labels))
    return report
