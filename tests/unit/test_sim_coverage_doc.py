"""docs/reproduction.md states only what its CSVs support: its text is regenerated
here from docs/figures/*.csv by the same code that wrote it, and must match exactly (apart from
nothing: the header line is taken from the file, and checked against the CSVs' trial count)."""

from __future__ import annotations

from pathlib import Path

from secure_release.reproduce.report import build_report
from secure_release.reproduce.sweeps import read_csv_rows

ROOT = Path(__file__).resolve().parents[2]
FIGS = ROOT / "docs" / "figures"
DOC = ROOT / "docs" / "reproduction.md"


def test_reproduction_doc_is_generated_from_its_csvs() -> None:
    text = DOC.read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.startswith("Trials per point:"))
    trials = {r["trials"] for name in ("fig5_adult", "fig9_cardinality") for r in read_csv_rows(FIGS / f"{name}.csv")}
    assert header.startswith(f"Trials per point: {trials.pop()};") and not trials
    pngs = sorted(p.name for p in FIGS.glob("fig*.png"))
    assert build_report(FIGS, header, pngs, "figures/") == text


def test_reproduction_doc_claims_are_the_csvs() -> None:
    """Spot checks of the issue's three contradicted sentences, straight from the CSVs."""
    rows = [r for f in sorted(FIGS.glob("fig*.csv")) for r in read_csv_rows(f)]
    ratios = [r["predicted_rmse"] / r["mean_l2_error"] for r in rows]
    text = DOC.read_text(encoding="utf-8")
    assert f"spans {min(ratios):.4f}-{max(ratios):.4f}" in text
    assert "within 1-4% above the mean l2 error at every point" not in text
    peaky = [r for r in read_csv_rows(FIGS / "fig9_cardinality.csv") if r["dataset"] == "peaky" and r["K"] >= 48]
    worse = sum(r["mean_l2_error_mle"] > r["mean_l2_error"] for r in peaky)
    assert f"at {worse} of {len(peaky)} points" in text
    cov = read_csv_rows(FIGS / "coverage.csv")
    cp = [r for r in cov if r["method"] == "clopper-pearson" and not r["simultaneous"]]
    assert min(r["min_coverage"] for r in cp) >= 0.95
