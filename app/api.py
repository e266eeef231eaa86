"""The notebook API: plan a release, run one in memory from DataFrames, simulate, load results.

    >>> from secure_release import api
    >>> p = api.plan(n=45222, alphabet=[6, 4], epsilon=0.5)
    >>> p.m, round(p.guarantee["epsilon"], 6), p.guarantee["delta"]
    (1472, 0.5, 0.0)

A release designed for the researcher's questions: ``d = api.design(n, schemas, epsilon,
["salary ~ education | sex"])`` picks tables and each one's disjoint sample; ``api.release(tables,
schemas, epsilon, design=d)`` releases them, and its Result answers ``questions()``, lists
``tables()`` and reads every analysis on the table that holds its attributes.

Every result converts to DataFrames (pandas by default, polars with ``backend="polars"``;
``pip install 'secure-release[notebook]'``). The release itself needs neither: it runs on numpy
(:func:`secure_release.mechanism.protocol.in_memory.run_release`). ``docs/tutorial.md`` walks through it.

The module is the notebook's one entry point; its pieces live beside it, each re-exported here:
planning before a release (``planning.py``), schemas as arguments (``schema_inputs.py``) and their
drafts (``schema_draft.py``), and :class:`Result` assembled below from one class per concern
(``result_base.py``: fields, printing and the routing of a release of several tables;
``result_views.py``, ``result_analyses.py``, ``result_export.py``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release import analysis as analysis  # the analyses' result types
from secure_release.curator.columnar import BadRowsError as BadRowsError  # the refusal of a bad table
from secure_release.frames import Backend as Backend
from secure_release.frames import TableInputError as TableInputError
from secure_release.frames import database_query as database_query
from secure_release.frames import text_columns, to_arrow, to_frame
from secure_release.imputation import Imputations as Imputations
from secure_release.imputed_fits import DegenerateImputationError as DegenerateImputationError
from secure_release.imputed_fits import PooledFit as PooledFit
from secure_release.mechanism.analysis.design import Design as Design
from secure_release.mechanism.analysis.design import design as _design
from secure_release.mechanism.analysis.pooling import pool as pool
from secure_release.mechanism.analysis.power import PowerPlan as PowerPlan
from secure_release.mechanism.analysis.suggest import DEFAULT_LIMIT as DEFAULT_LIMIT
from secure_release.mechanism.analysis.suggest import SuggestionReport as SuggestionReport
from secure_release.mechanism.errors import DesignMismatchError as DesignMismatchError
from secure_release.mechanism.errors import MultiTableResultError as MultiTableResultError
from secure_release.mechanism.errors import NoTableHoldsError as NoTableHoldsError
from secure_release.mechanism.errors import SecureReleaseError as SecureReleaseError
from secure_release.mechanism.estimation.report import TABLES_FORMAT, ReleaseReport, TablesReport, build_report
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.guarantee import utility_check
from secure_release.mechanism.privacy.plan import ReleasePlan as ReleasePlan
from secure_release.mechanism.protocol.in_memory import CuratorTable, run_release, run_tables_release
from secure_release.mechanism.protocol.tables import tables_report
from secure_release.mechanism.schema import Attribute as Attribute
from secure_release.mechanism.schema import CuratorSchema, JointSchema, attribute_to_dict
from secure_release.mechanism.simulation.monte_carlo import ESTIMATORS, sweep
from secure_release.planning import Plan as Plan
from secure_release.planning import plan as plan
from secure_release.planning import power as power
from secure_release.planning import suggest as suggest
from secure_release.result_analyses import NoDesignError as NoDesignError
from secure_release.result_analyses import ResultAnalyses
from secure_release.result_base import FloatArray as FloatArray
from secure_release.result_export import ResultExport
from secure_release.result_impute import ResultImpute
from secure_release.schema_draft import CODEBOOK_WARNING as CODEBOOK_WARNING
from secure_release.schema_draft import DRAFT_DEFAULT_BINS as DRAFT_DEFAULT_BINS
from secure_release.schema_draft import DRAFT_MAX_NUMERIC_CATEGORIES as DRAFT_MAX_NUMERIC_CATEGORIES
from secure_release.schema_draft import DRAFT_MISSING_LABEL as DRAFT_MISSING_LABEL
from secure_release.schema_draft import EDGE_ROUNDING_TOLERANCE as EDGE_ROUNDING_TOLERANCE
from secure_release.schema_draft import DraftNeedsRangeError as DraftNeedsRangeError
from secure_release.schema_draft import draft_schema as draft_schema
from secure_release.schema_draft import equal_width_edges as equal_width_edges
from secure_release.schema_inputs import IdColumnConflictError as IdColumnConflictError
from secure_release.schema_inputs import load_schema as load_schema
from secure_release.schema_inputs import schema as schema
from secure_release.schema_inputs import schema_and_id_column, schemas_in_order
from secure_release.schema_inputs import schema_to_dict as schema_to_dict


# ------------------------------------------------------------------------------------- results
class Result(ResultAnalyses, ResultExport, ResultImpute):
    """A released estimate (:class:`ReleaseReport`) with DataFrame views, marginals and plots.

    ``truth`` (the true shares of the aligned table) is known only for in-memory releases. It is
    the private data the release protects, so it never leaves the object by default:
    :meth:`cells`, :meth:`to_pandas`, :meth:`to_polars`, :meth:`to_dict` and :meth:`save` omit it
    unless the caller passes ``include_truth=True`` (simulations and demos only).

    A release of several tables (``release(design=...)``, a designed release fetched or loaded)
    holds one single-table Result a table in ``parts`` and the :class:`TablesReport`. Its
    analyses (:meth:`test_independence`, :meth:`association`, :meth:`logistic`,
    :meth:`compare_models`, :meth:`marginal`, :meth:`conditional`, :meth:`plot_marginal`) read the
    table that holds every attribute they name (of several, the one with the largest m_t a_t^2),
    or raise ``NoTableHoldsError`` listing the tables; :meth:`tables` lists them, :meth:`part`
    gives one, :meth:`questions` answers the design's questions. ``report``, ``truth``,
    :meth:`cells` and the other views of one table of cells are then the first estimated table's.
    """

    # Nothing of its own: one base class a concern, each a subclass of ResultBase (the frozen
    # dataclass of the fields, whose __init__, __eq__, __repr__ and pickling every Result uses). A
    # new concern is a module with `class ResultX(ResultViews)` (or ResultBase), added to the bases.


def _result(report: ReleaseReport, truth: FloatArray | None = None) -> Result:
    message = utility_check(report.plan)["message"]
    return Result(report, truth, (message,) if message else ())


def load_result(path: str | Path) -> Result:
    """A result file the researcher wrote (``<release>.json``, or the API's ``to_dict``): one
    table, or a release of several (format ``secure-release/result/2``)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict) and data.get("format") == TABLES_FORMAT:
        return result_from_tables(TablesReport.from_dict(data))
    return _result(ReleaseReport.from_dict(data))


def result_from_tables(report: TablesReport, truths: Sequence[FloatArray | None] | None = None) -> Result:
    """The :class:`Result` of a release of several tables: a single-table Result a table
    (``parts``; ``truths``: each table's true shares, in-memory runs only), its analyses routed to
    the table holding the attributes named; ``report`` is the first estimated table's. The
    warnings are each table's, named by its number."""
    parts = tuple(None if r is None else _result(r, None if truths is None else truths[t])
                  for t, r in enumerate(report.tables))  # fmt: skip
    first = next((p for p in parts if p is not None), None)
    if first is None:
        raise NoKeysEstimatedError(f"release {report.release_id!r}: no table was estimated ({dict(report.missing)})")
    warnings_ = tuple(f"table {t}: {w}" for t, p in enumerate(parts, start=1) if p is not None for w in p.warnings)
    whole = Result(first.report, first.truth, warnings_, parts, report)
    for p in parts:  # each table states the whole release's guarantee, not its own Theorem 3.2
        if p is not None:
            object.__setattr__(p, "whole", whole)
    return whole


class NoKeysEstimatedError(SecureReleaseError):
    """A release of several tables of which no table could be estimated (keys missing)."""


class DesignEpsilonError(DesignMismatchError):
    """``release(design=d)`` with an epsilon other than the design's: a design fixes the release's
    total epsilon (its m_t and gamma_t are chosen for it)."""


# ------------------------------------------------------------------------------------- release
@dataclass(frozen=True)
class TestKeys:
    """Every secret of a release derived from one integer: reproducible runs for tutorials and
    tests ONLY (anyone who knows the integer can undo the sampling's secrecy and the pads)."""

    __test__ = False  # not a pytest class
    seed: Seed
    alignment_key: AlignmentKey
    pram_key: PramKey
    pad_keys: tuple[PadKey, ...]

    @classmethod
    def from_int(cls, value: int, curators: int) -> TestKeys:
        def derive(label: str) -> bytes:
            return hashlib.sha256(f"secure-release test keys {value} {label}".encode()).digest()

        pads = tuple(PadKey(derive(f"pad {j}")) for j in range(curators))
        return cls(Seed(derive("seed")), AlignmentKey(derive("align")), PramKey(derive("pram")), pads)


def curator_tables(
    tables: Mapping[str, Any],
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path],
    id_column: str | None = None,
) -> list[CuratorTable]:
    """In-memory curator tables (joint-code order = the order of ``tables``) from DataFrames,
    Arrow tables, DuckDB relations or mappings: each read by the curator's own reader
    (:func:`secure_release.curator.columnar.check_rows`, the one cell rule), so a table gives
    the codes, and the refusals (:class:`BadRowsError`, a line being the row's position + 2 as
    in the table's CSV with a header), that ``secure-release-curator`` gives for the same table
    in a file. The ids come from each schema's ``id_column`` (``id_column`` fills in a schema
    without one)."""
    from secure_release.curator.columnar import RowSource, TableSpec, check_rows, encode_checked

    if set(tables) != set(schemas):
        raise TableInputError(f"tables for {sorted(tables)} but schemas for {sorted(schemas)}; give one of each")
    out: list[CuratorTable] = []
    for name, table in tables.items():
        parsed, ids = schema_and_id_column(name, schemas[name], id_column)
        spec = TableSpec(CuratorSchema(name, parsed.attributes), ids)
        arrow = to_arrow(table, f"curator {name}")
        source = RowSource(Path(f"curator {name}"), is_csv=False)
        out.append(encode_checked(check_rows(list(arrow.column_names), arrow, spec, source), spec))
    return out


def curator_id_columns(
    tables: Mapping[str, Any], schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path],
    id_column: str | None = None,
) -> dict[str, str]:
    """Each curator's id column, as :func:`curator_tables` takes it."""
    return {name: schema_and_id_column(name, schemas[name], id_column)[1] for name in tables}


def release(
    tables: Mapping[str, Any],
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path],
    epsilon: float,
    m: int | None = None,
    *,
    id_column: str | None = None,
    cipher: str = "chacha20",
    release_id: str = "release-1",
    granted: Sequence[str] | None = None,
    test_keys: int | None = None,
    design: Design | None = None,
) -> Result:
    """Run a whole release in memory (align, sample, encrypt, PRAM, decrypt, estimate) on one
    table per curator (pandas/polars DataFrames, Arrow tables or mappings of columns), keyed by
    curator name in joint-code order. ``schemas`` per curator: a CuratorSchema, a schema dict or
    file, or ``{attribute: [categories]}``; each table is read as the curator CLI reads a file
    (the one cell rule: docs/own-data.md), its ids from the schema's ``id_column`` (the
    ``id_column`` keyword fills in a schema without one; a conflict raises
    :class:`IdColumnConflictError`). ``granted``: curators whose keys the researcher gets
    (default all; fewer gives a marginal). ``test_keys``: reproducible keys, tutorials/tests only.
    Warns (``UserWarning``) when the plan's predicted RMSE exceeds the typical cell share 1/K.

    ``design`` (a :class:`Design` from :func:`design` or :func:`load_design`): release the
    design's tables from disjoint samples of one alignment instead of the whole joint
    (``mechanism.protocol.in_memory.run_tables_release``: each table's m_t and gamma_t as planned
    for ``design.n`` records, rescaled to the aligned n), for the design's digest. ``epsilon``
    must be the design's (else :class:`DesignEpsilonError`), ``m`` None, the schemas the design's
    (else ``DesignMismatchError``); ``granted`` and ``test_keys`` work as without a design. The
    :class:`Result` then holds one table a part (``tables()`` lists them, ``part(t)`` is one), its
    analyses go to the table that holds the attributes they name (``NoTableHoldsError`` if none
    does), ``questions()`` answers the design's questions, and ``report`` is the first table's.
    """
    ts = curator_tables(tables, schemas, id_column)
    names = [t.name for t in ts]
    keys = TestKeys.from_int(test_keys, len(ts)) if test_keys is not None else None
    subset = None if granted is None else [names.index(g) for g in granted]
    if design is not None:
        return _designed_release(ts, design, epsilon, m, cipher, release_id, subset, keys)
    result = run_release(
        ts, epsilon, m, CipherMode.parse(cipher), release_id,
        seed=keys.seed if keys else None, alignment_key=keys.alignment_key if keys else None,
        pram_key=keys.pram_key if keys else None, granted=subset, pad_keys=keys.pad_keys if keys else None,
    )  # fmt: skip
    covered = result.estimate.curators
    joint = JointSchema(tuple(ts[j].schema for j in covered))
    report = build_report(release_id, result.plan, names, result.estimate, joint)
    out = _result(report, result.true_type)
    for message in out.warnings:
        warnings.warn(message, UserWarning, stacklevel=2)
    return out


def design(
    n: int,
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path]
    | Sequence[CuratorSchema | Mapping[str, Any] | str | Path],
    epsilon: float,
    questions: Sequence[str],
    marginals: Mapping[str, Sequence[float]] | None = None,
    **options: Any,
) -> Design:
    """The release designed for ``questions`` (``"A ~ B"``, ``"A ~ B | C + D"``, ``"Y ~ X1 + X2"``)
    on n aligned records of the curators' ``schemas`` at total ``epsilon``
    (:func:`mechanism.analysis.design.design`): its tables, disjoint m_t and gamma_t (Eq. T1), each
    question's detectable Cramer's V beside the whole joint's. ``schemas`` as :func:`release` takes
    them, keyed by curator in joint-code order (a CuratorSchema, a schema dict or file, or
    ``{attribute: [categories]}``), or a list of CuratorSchemas, schema dicts or files (named as
    they say). ``marginals``: public expected shares per attribute (else uniform). ``options``:
    alpha, power, at_v (a Cramer's V at which to report each question's power), max_useful_v,
    replicates, seed. The :class:`Design` prints as its tables and questions, shows as HTML in a
    notebook, and :func:`save_design` writes the file every curator runs (``--design``); pass it to
    :func:`release` as ``design=``."""
    return _design(n, schemas_in_order(schemas), epsilon, list(questions), marginals, **options)


def _designed_release(
    ts: Sequence[CuratorTable], d: Design, epsilon: float, m: int | None, cipher: str, release_id: str,
    subset: Sequence[int] | None, keys: TestKeys | None,
) -> Result:  # fmt: skip
    """:func:`release` of a design's tables: ``mechanism.protocol.in_memory.run_tables_release``
    with each table's attributes, m_t and gamma_t as the design planned them for ``d.n`` records
    (rescaled to the aligned n), its digest and epsilon; labelled by ``protocol.tables.tables_report``."""
    if not isinstance(d, Design):
        raise DesignMismatchError(f"design= takes a Design (api.design, api.load_design), got {type(d).__name__}")
    if float(epsilon) != d.epsilon:
        raise DesignEpsilonError(f"epsilon {epsilon!r} differs from the design's {d.epsilon!r}: a design fixes the "
                                 "release's total epsilon (its m_t and gamma_t are chosen for it); pass the design's "
                                 "epsilon, or design again for this one")  # fmt: skip
    if m is not None:
        raise DesignMismatchError(f"m={m} with design=: a design fixes each table's m_t; pass no m")
    own = {t.name: t.schema for t in ts}
    theirs = {s.name: s for s in d.schemas}
    if set(own) != set(theirs):
        raise DesignMismatchError(f"the design is for curators {sorted(theirs)}, the tables are of {sorted(own)}; "
                                  "give one table for each curator of the design")  # fmt: skip
    for name, s in theirs.items():
        if own[name].attributes != s.attributes:
            raise DesignMismatchError(
                f"curator {name!r}: the design's schema has {[attribute_to_dict(a) for a in s.attributes]}, its table "
                f"is read with {[attribute_to_dict(a) for a in own[name].attributes]}; design with the schema the "
                "table is read with"
            )
    planned = d.planned_tables()
    attributes = [a for a, _, _ in planned]
    res = run_tables_release(
        ts, attributes, [x for _, x, _ in planned], [g for _, _, g in planned], d.epsilon, d.digest(),
        d.n, CipherMode.parse(cipher), release_id, seed=keys.seed if keys else None,
        alignment_key=keys.alignment_key if keys else None, pram_key=keys.pram_key if keys else None,
        granted=subset, pad_keys=keys.pad_keys if keys else None,
    )  # fmt: skip
    granted = set(range(len(ts))) if subset is None else set(subset)
    missing = {
        t: "no key of " + ", ".join(res.spec.curators[j] for j in layout.live if j not in granted)
        for t, (layout, e) in enumerate(zip(res.spec.tables, res.estimates, strict=True)) if e is None
    }
    report = tables_report(release_id, res.spec.curators, res.spec.n, d.epsilon, res.spec.tables, attributes, own,
                           res.estimates, d.to_dict(), d.digest(), missing)  # fmt: skip
    out = result_from_tables(report, res.true_types)
    for message in out.warnings:
        warnings.warn(message, UserWarning, stacklevel=3)
    return out


def save_design(design: Design, path: str | Path) -> Path:
    """Write ``design`` as the file every curator runs with (``secure-release-curator run
    --design FILE``); :func:`load_design` reads it back."""
    from secure_release.infra.designfile import write_design

    return write_design(design, path)


def load_design(path: str | Path) -> Design:
    """The design in a file :func:`save_design` or ``secure-release plan --question ... --out``
    wrote (named errors for anything else)."""
    from secure_release.infra.designfile import read_design

    return read_design(path)


# ---------------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class Simulation:
    """Simulated releases on a count table: one summary row per (epsilon, m) point."""

    rows: tuple[dict[str, Any], ...]

    def to_frame(self, backend: Backend = "pandas") -> Any:
        """The summary rows as a DataFrame (mean l2 errors, their SEs, predicted RMSE, bounds)."""
        keys = [k for k, v in self.rows[0].items() if not isinstance(v, list)]
        return to_frame({k: np.asarray([r[k] for r in self.rows], dtype=object) for k in keys}, backend)


def simulate(
    counts: npt.ArrayLike,
    epsilon: float | Sequence[float],
    m: int | Sequence[int] | None = None,
    trials: int = 200,
    alphabet_sizes: Sequence[int] | None = None,
    seed: int = 0,
    estimators: Sequence[str] = ESTIMATORS,
) -> Simulation:
    """Simulate ``trials`` releases per (epsilon, m) on a joint count table (curator-major codes);
    m defaults to m* for each epsilon. Fast path: the exact distribution of the observed counts."""
    from secure_release.mechanism.privacy.accounting import optimal_sample_size_int

    c = np.asarray(counts, dtype=np.int64)
    n, K = int(c.sum()), int(c.size)
    epsilons = [float(epsilon)] if isinstance(epsilon, int | float) else [float(e) for e in epsilon]
    points = [
        (e, mm)
        for e in epsilons
        for mm in ([optimal_sample_size_int(n, K, e)] if m is None else [m] if isinstance(m, int) else list(m))
    ]
    out = sweep(c, points, trials, np.random.default_rng(seed), alphabet_sizes, estimators)
    return Simulation(tuple(p.summary() for p in out))


def fetch_result(address: str, certs: str | Path, name: str, release_id: str, timeout: float = 300.0) -> Result:
    """An estimate from a running researcher service, as analyst ``name`` (mutual TLS with the
    analyst's own directory ``certs``: ``ca.pem``, ``NAME.pem``, ``NAME.key``)."""
    from secure_release.analyst import fetch_report

    report = fetch_report(address, Path(certs), name, release_id, wait=True, timeout=timeout)
    return result_from_tables(report) if isinstance(report, TablesReport) else _result(report)


# ------------------------------------------------------------------------------- four services
def release_over_services(
    tables: Mapping[str, Any],
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path],
    epsilon: float,
    workdir: str | Path,
    m: int | None = None,
    *,
    id_column: str | None = None,
    release_id: str = "release-1",
    test_keys: int | None = None,
) -> Result:
    """The same release as :func:`release`, across real processes on this machine: a project CA,
    the server, one curator per table (the first leads) and the researcher over mutual TLS; the
    estimate is read as analyst. With the same ``test_keys`` the numbers equal :func:`release`'s
    (that needs SECURE_RELEASE_TESTING=1 in the children's environment: set here)."""
    import os

    import pyarrow as pa
    import pyarrow.csv as pacsv

    from secure_release.cluster import Cluster, get_estimate, launch_release, parties
    from secure_release.infra.pki import init_pki

    root = Path(workdir)
    (root / "data").mkdir(parents=True, exist_ok=True)
    ts = curator_tables(tables, schemas, id_column)  # refuses a bad table here, before any process starts
    id_columns = curator_id_columns(tables, schemas, id_column)
    for t in ts:
        names = [id_columns[t.name], *(a.name for a in t.schema.attributes)]
        texts = text_columns(tables[t.name], names, f"curator {t.name}")  # the cell rule's text: read back the same
        pacsv.write_csv(pa.table(texts), root / "data" / f"{t.name}.csv")
        (root / "data" / f"{t.name}.json").write_text(json.dumps(schema_to_dict(t.schema, id_columns[t.name])))
    curators = [t.name for t in ts]
    init_pki(root / "certs", parties(curators), force=True)
    keys = TestKeys.from_int(test_keys, len(ts)) if test_keys is not None else None
    align = keys.alignment_key if keys else AlignmentKey.generate()
    (root / "align.key").write_text(align.reveal().hex())
    (root / "align.key").chmod(0o600)
    extra: dict[str, list[str]] = {}
    server_extra: list[str] = []
    env = dict(os.environ)
    if keys is not None:
        env["SECURE_RELEASE_TESTING"] = "1"
        extra = {c: ["--insecure-test-pad-key", keys.pad_keys[j].reveal().hex()] for j, c in enumerate(curators)}
        extra[curators[0]] += ["--insecure-test-seed", keys.seed.reveal().hex()]
        server_extra = ["--insecure-test-pram-key", keys.pram_key.reveal().hex()]
    cluster = Cluster(root, env=env)
    try:
        addrs = launch_release(
            cluster, root / "data", root / "certs", release_id, epsilon, m, "chacha20", root / "align.key",
            server_extra=server_extra, curators=curators, curator_extra=extra,
        )  # fmt: skip
        resp = get_estimate(addrs["researcher"], root / "certs", release_id)
    finally:
        cluster.close()
    from dataclasses import replace

    from secure_release.infra.wire import report_from_pb

    report = report_from_pb(resp)
    sizes = tuple(t.schema.alphabet_size for t in ts)
    return _result(replace(report, plan=replace(report.plan, alphabet_sizes=sizes), curators=tuple(curators)))
