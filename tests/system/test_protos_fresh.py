import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_grpc_modules_are_fresh() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "secure_release.protos.generate", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
