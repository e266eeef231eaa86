"""``secure-release plan --question`` and ``secure-release analyst questions``, run as the console
script's ``main(argv)``: the design printed and written is ``api.design``'s, bad questions and
questions the records cannot answer exit 2 with a named error (the latter after the design's
advice), the plan without --question is unchanged, and the answers of a saved designed result
print (a release of the whole joint exits 2)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from secure_release import api
from secure_release.cli import main
from secure_release.infra.designfile import read_design
from secure_release.mechanism.analysis.design import Design

SCHEMAS = {
    "alice": {"a": ["a0", "a1"], "b": ["b0", "b1", "b2"], "c": ["c0", "c1"]},
    "bob": {"x": ["x0", "x1"], "y": ["y0", "y1", "y2"], "z": ["z0", "z1"]},
}
Q = ["a ~ x", "b ~ y | c"]


@pytest.fixture()
def files(tmp_path: Path) -> list[str]:
    out = []
    for name, attrs in SCHEMAS.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(api.schema_to_dict(api.schema(name, attrs))))
        out += ["--schema", str(path)]
    return out


def _questions(*texts: str) -> list[str]:
    return [arg for q in texts for arg in ("--question", q)]


def test_plan_prints_and_writes_the_design(
    files: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "design.json"
    code = main(["plan", "--n", "6000", *files, "--epsilon", "1", *_questions(*Q), "--at-v", "0.1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    want = api.design(6000, SCHEMAS, 1.0, Q, at_v=0.1)
    assert read_design(out).digest() == want.digest()
    assert str(want) in text and f"wrote {out}" in text
    assert "V design" in text and "V joint" in text and "power@0.1" in text  # beside the whole joint, power at V
    code = main(["plan", "--n", "6000", *files, "--epsilon", "1", *_questions(*Q), "--at-v", "0.1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["digest"] == want.digest() and Design.from_dict(doc).digest() == want.digest()


def test_plan_reads_public_marginals(files: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shares = tmp_path / "shares.json"
    shares.write_text(json.dumps({"a": [0.2, 0.8]}))
    assert main(["plan", "--n", "6000", *files, "--epsilon", "1", *_questions(*Q), "--marginals", str(shares),
                 "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["marginals"] == {"a": [0.2, 0.8]}
    assert doc["digest"] == api.design(6000, SCHEMAS, 1.0, Q, {"a": [0.2, 0.8]}).digest()
    shares.write_text(json.dumps({"a": "0.2, 0.8"}))
    assert main(["plan", "--n", "6000", *files, "--epsilon", "1", *_questions(*Q), "--marginals", str(shares)]) == 2
    assert "MarginalsFileError" in capsys.readouterr().err
    shares.write_text(json.dumps({"q": [0.5, 0.5]}))
    assert main(["plan", "--n", "6000", *files, "--epsilon", "1", *_questions(*Q), "--marginals", str(shares)]) == 2
    err = capsys.readouterr().err
    assert "UnknownAttributeError" in err and "'q'" in err


def test_bad_questions_exit_2_with_a_named_error(
    files: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--n", "6000", *files, "--epsilon", "1", *_questions("a ~ salary")]) == 2
    err = capsys.readouterr().err
    assert "UnknownAttributeError" in err and "'salary'" in err and "['a', 'b', 'c', 'x', 'y', 'z']" in err
    assert main(["plan", "--n", "6000", *files, "--epsilon", "1", *_questions("a ~ ~ x")]) == 2
    assert "InvalidQuestionError" in capsys.readouterr().err
    out = tmp_path / "weak.json"
    code = main(["plan", "--n", "200", *files, "--epsilon", "0.1", *_questions(*Q), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and "QuestionsNeedMoreError" in captured.err and "Q1 'a ~ x'" in captured.err
    assert "no useful power" in captured.out and "more epsilon" in captured.out  # the design's advice, printed
    assert not out.exists()  # no design file for questions the records cannot answer
    assert main(["plan", "--n", "6000", *files, "--epsilon", "1", *_questions(*Q), "--alphabet", "12,12"]) == 2
    assert "PlanFlagsError" in capsys.readouterr().err
    assert main(["plan", "--n", "6000", *files, "--epsilon", "1", "--out", str(out)]) == 2  # --out needs --question
    assert "PlanFlagsError" in capsys.readouterr().err


def test_plan_without_questions_is_unchanged(files: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--n", "45222", "--alphabet", "6,4", "--epsilon", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["m"] == 1472
    assert main(["plan", "--n", "6000", *files, "--epsilon", "1"]) == 0
    text = capsys.readouterr().out
    assert "samples m" in text and "Release design" not in text


def test_plan_help_teaches_questions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = capsys.readouterr().out
    assert '--question "salary ~ education | sex"' in text and "--out design.json" in text and "--marginals" in text


def _frames(n: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    ids = np.array([f"p{i}" for i in range(n)])
    cols = {name: {a: rng.choice(cats, n) for a, cats in attrs.items()} for name, attrs in SCHEMAS.items()}
    return {name: {"id": ids, **c} for name, c in cols.items()}


def test_analyst_questions_of_a_result_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = api.design(6000, SCHEMAS, 1.0, Q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        designed = api.release(_frames(6000), SCHEMAS, 1.0, design=d, release_id="r-q", test_keys=2)
        classic = api.release(_frames(6000), SCHEMAS, 1.0, release_id="r-j", test_keys=2)
    path = designed.save(tmp_path / "r-q.json")
    assert main(["analyst", "questions", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(json.dumps(designed.questions().to_dict()))
    assert [q["question"] for q in doc["questions"]] == Q
    assert main(["analyst", "questions", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.strip() == str(designed.questions())
    assert main(["analyst", "questions", str(classic.save(tmp_path / "r-j.json"))]) == 2
    err = capsys.readouterr().err
    assert "NoDesignError" in err and "r-j" in err
    assert main(["analyst", "questions", "r-unknown"]) == 2  # neither a file nor a --researcher to ask
    assert "ResultSourceError" in capsys.readouterr().err


def test_analyst_subcommands_read_the_table_that_holds_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from secure_release import analysis
    from secure_release.commands import analyst as analyst_cmd

    d = api.design(6000, SCHEMAS, 1.0, Q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        designed = api.release(_frames(6000), SCHEMAS, 1.0, design=d, release_id="r-q", test_keys=2)
    # the researcher's answer, as the fetch path builds it from a saved TablesReport
    loaded = api.load_result(designed.save(tmp_path / "r-q.json"))
    monkeypatch.setattr(analyst_cmd, "fetch", lambda args: loaded)
    conn = ["--researcher", "127.0.0.1:1", "--insecure"]
    assert main(["analyst", "test", "r-q", "--between", "b", "--and", "y", "--given", "c", "--json", *conn]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = analysis.test_independence(designed.part(2).report, "b", "y", ["c"])
    assert doc["test"]["p_value"] == want.p_value and doc["test"]["m"] == designed.part(2).plan.m
    assert main(["analyst", "test", "r-q", "--between", "a", "--and", "y", *conn]) == 2  # a and y: no one table
    err = capsys.readouterr().err
    assert "NoTableHoldsError" in err and "table 1 (a, x); table 2 (b, c, y)" in err
    assert main(["analyst", "export", "r-q", str(tmp_path / "r.csv"), *conn]) == 2
    assert "MultiTableResultError" in capsys.readouterr().err
