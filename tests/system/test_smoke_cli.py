import json
import subprocess
import sys


def test_plan_json_matches_reference_numbers() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "secure_release", "plan", "--n", "45222", "--alphabet", "6,4",
         "--epsilon", "0.5", "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    report = json.loads(out)
    assert report["m"] == 1472
    assert abs(report["predicted_rmse"] - 0.056) < 5e-4
    assert abs(report["bound"] - 0.308) < 5e-4
