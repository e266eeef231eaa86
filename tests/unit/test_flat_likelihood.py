"""A model whose likelihood is flat along a coefficient says so, even when the fit converged (the
finding: at m = 76 a fit printed converged=True with a coefficient of 8.64 and a standard error
of 163, and no warning). Rule: a standard error above 10 on the logit scale, or not finite, is
"not estimated": the table flags the row, a warning line says why and what to do, the property
``not_estimated`` names it, and the API warns (FlatLikelihoodWarning). A well-determined fit at a
large m is not flagged."""

from __future__ import annotations

import dataclasses
import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest

from secure_release import analysis, api
from secure_release.mechanism.analysis import regression as reg
from secure_release.mechanism.errors import FlatLikelihoodWarning

LEVELS = ("lo", "mid", "hi")
# educ x sex cells in the design's order (educ slowest): the level "hi" holds 2% of the population
RARE_HI = np.array([0.3, 0.3, 0.19, 0.19, 0.01, 0.01])
EVEN = np.array([0.2, 0.15, 0.25, 0.1, 0.2, 0.1])
BETA = np.array([[-1.0, 0.5, 1.0, 0.2]])
REMEDY = "Merge bins or levels, spend more epsilon, or release more records."


def _design() -> tuple[np.ndarray, list[str]]:
    return reg.design_matrix([3, 2], ["educ", "sex"], [list(LEVELS), ["f", "m"]])


def _fit(shares: np.ndarray, m: int, keep: float, seed: int) -> tuple[reg.ModelFit, np.ndarray]:
    """A fit of m records drawn from the model and sent through keep-or-uniform PRAM: exactly
    Multinomial(m, keep p + (1 - keep)/N) (fixed seed)."""
    design, names = _design()
    p = reg.outcome_probabilities(design, BETA) * shares[None, :]
    q = keep * p.reshape(-1) + (1.0 - keep) / p.size
    counts = np.random.default_rng(seed).multinomial(m, q).reshape(p.shape)
    return reg.fit_logistic(counts, keep, design, outcome_levels=["low", "high"], names=names), counts


def _row(text: str, label: str) -> list[str]:
    hits = [line for line in text.splitlines() if re.match(re.escape(label) + r"\s{2,}\S", line)]
    assert len(hits) == 1, (label, text)
    return hits[0][len(label):].split()


@pytest.mark.parametrize("seed", [15, 105])  # standard error 12 (a plausible-looking row) and 1e12
def test_the_finding_a_converged_fit_at_small_m_with_a_huge_se_is_flagged(seed: int) -> None:
    fit, _ = _fit(RARE_HI, 76, 0.75, seed)
    i = fit.names.index("educ[hi]")
    # the premise: about 1.5 of the 76 true records are at the level (the observed cells hold mostly
    # PRAM's uniform replacements), yet the fit converged (the finding)
    assert 76 * RARE_HI[4:].sum() < 2 and fit.converged
    assert fit.standard_error[i] > 10 and all(s < 2 for j, s in enumerate(fit.standard_error) if j != i)
    assert fit.not_estimated == ("educ[hi]",)
    assert fit.flat.tolist() == [j == i for j in range(len(fit.names))]
    text = str(fit)
    assert _row(text, "educ[hi]") == [f"{fit.coef[i]:.4f}" if abs(fit.coef[i]) < 1e5 else f"{fit.coef[i]:.4g}",
                                      f"{fit.standard_error[i]:.4f}" if fit.standard_error[i] < 1e5
                                      else f"{fit.standard_error[i]:.4g}", "not", "estimated"]  # fmt: skip
    for j, name in enumerate(fit.names):
        if j != i:
            assert _row(text, name)[-1] != "estimated" and _row(text, name)[:2] == [
                f"{fit.coef[j]:.4f}", f"{fit.standard_error[j]:.4f}"]
    warning = " ".join(text[text.index("WARNING: flat likelihood"):].split())
    assert warning.startswith("WARNING: flat likelihood in educ[hi]: too few records in some cell")
    assert "although the fit converged" in warning and REMEDY in warning
    assert "not estimated: educ[hi]" in repr(fit) and "not estimated" in fit._repr_html_()
    assert fit.columns()["not_estimated"] == fit.flat.tolist()


def test_the_rule_at_its_boundary() -> None:
    """SE exactly 10 passes, the next float does not; NaN and inf are flagged."""
    fit, _ = _fit(EVEN, 2000, 0.75, 1)
    planted = dataclasses.replace(fit, standard_error=np.array([10.0, math.nextafter(10.0, math.inf), np.nan, np.inf]))
    assert planted.flat.tolist() == [False, True, True, True]
    assert planted.not_estimated == fit.names[1:]
    assert "inform them, so they are not estimated" in planted.flat_likelihood_warning
    text = str(planted)
    assert _row(text, fit.names[0])[-1] != "estimated"
    assert all(_row(text, name)[-2:] == ["not", "estimated"] for name in fit.names[1:])
    unconverged = dataclasses.replace(planted, converged=False)
    assert "although the fit converged" not in unconverged.flat_likelihood_warning
    assert "did not converge" in str(unconverged)


def test_a_well_determined_fit_at_large_m_is_not_flagged() -> None:
    fit, _ = _fit(EVEN, 20000, 0.75, 2)
    assert fit.converged and float(np.max(fit.standard_error)) < 1  # the premise: every level well informed
    assert fit.not_estimated == () and fit.flat_likelihood_warning == ""
    text = str(fit)
    assert "not estimated" not in text and "WARNING" not in text
    assert all(_row(text, name)[-2:] == [f"{lo:.4f}", f"{hi:.4f}"]
               for name, lo, hi in zip(fit.names, fit.ci_low, fit.ci_high, strict=True))


# ------------------------------------------------------------------------------ through the API
SCHEMAS = {"alice": {"education": list(LEVELS)}, "bob": {"sex": ["f", "m"], "salary": ["low", "high"]}}


@pytest.fixture(scope="module")
def small() -> api.Result:
    """A release at m = 76 whose observed counts hold one record of education = hi (the cells
    are set here, so the premise does not hang on the sample the keys draw)."""
    rng = np.random.default_rng(0)
    n = 400
    ids = np.char.add("p", np.arange(n).astype(str))
    education = np.array(["lo"] * 240 + ["mid"] * 158 + ["hi"] * 2)
    rng.shuffle(education)
    tables = {
        "alice": pd.DataFrame({"id": ids, "education": education}),
        "bob": pd.DataFrame({"id": ids, "sex": rng.choice(["f", "m"], n),
                             "salary": np.where(rng.random(n) < 0.3, "high", "low")}),
    }  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = api.release(tables, SCHEMAS, epsilon=1.5, m=76, test_keys=0)
    r = res.report
    column = r.attributes.index("education")
    hi = [i for i, labels in enumerate(r.labels) if labels[column] == "hi"]
    observed = r.observed.copy()
    observed[hi] = 0
    observed[hi[0]] = 1
    others = [i for i in range(len(r.labels)) if i not in hi]
    observed[others[0]] += int(r.observed.sum() - observed.sum())  # m stays 76
    return api.Result(dataclasses.replace(r, observed=observed))


def test_the_api_flags_warns_and_prints_a_flat_model(small: api.Result) -> None:
    assert int(small.report.observed.sum()) == 76
    with pytest.warns(FlatLikelihoodWarning, match=re.escape("flat likelihood in education[hi]")) as caught:
        model = small.logistic("salary", ["education", "sex"])
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert REMEDY in str(caught[0].message)
    assert "education[hi]" in model.not_estimated and model.not_estimated == model.fit.not_estimated
    text = str(model)
    assert _row(text, "education[hi]")[-2:] == ["not", "estimated"]
    assert "WARNING: flat likelihood in education[hi]" in " ".join(text.split())
    assert "not estimated: education[hi]" in repr(model)
    frame = model.to_frame()
    assert frame["not_estimated"].tolist() == [n in model.not_estimated for n in model.fit.names]
    assert model.to_dict() == analysis.Model(model.outcome, model.covariates, model.interactions, model.over,
                                             model.fit).to_dict()  # fmt: skip  # the JSON is unchanged


def test_a_comparison_with_a_flat_model_says_so(small: api.Result) -> None:
    with pytest.warns(FlatLikelihoodWarning):
        full = small.logistic("salary", ["education", "sex"])
        comparison = small.compare_models(small.logistic("salary", ["sex"]), full)
    text = " ".join(str(comparison).split())
    assert "WARNING (full): flat likelihood in education[hi]" in text
    assert _row(str(comparison), "full")[-1].startswith("education[hi]")


def test_the_api_does_not_warn_on_a_well_determined_model() -> None:
    rng = np.random.default_rng(3)
    n = 4000
    ids = np.char.add("p", np.arange(n).astype(str))
    tables = {
        "alice": pd.DataFrame({"id": ids, "education": rng.choice(list(LEVELS), n)}),
        "bob": pd.DataFrame({"id": ids, "sex": rng.choice(["f", "m"], n), "salary": rng.choice(["low", "high"], n)}),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = api.release(tables, SCHEMAS, epsilon=3.0, m=2000, test_keys=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = res.logistic("salary", ["education", "sex"])
    assert not [w for w in caught if issubclass(w.category, FlatLikelihoodWarning)]
    assert model.fit.converged and model.not_estimated == ()
    assert "not estimated" not in str(model) and "WARNING" not in str(model)
