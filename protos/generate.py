"""Regenerate the committed gRPC modules: ``python -m secure_release.protos.generate [--check]``.

Uses the pinned grpcio-tools and mypy-protobuf (see pyproject's dev extra). ``--check``
regenerates into a temporary directory and exits 1 if anything differs from the committed
files (the freshness check the tests run).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

# The repository's protos/ folder. protoc sees it under the virtual include path
# ``secure_release/protos`` (``-Isecure_release/protos=<folder>``), so the generated modules
# import ``secure_release.protos.securerelease.v1`` (the installed name) and name the .proto by
# that path, with no link on disk.
PROTOS = Path(__file__).resolve().parent
VIRTUAL = "secure_release/protos"
PROTO = "securerelease/v1/securerelease.proto"
GENERATED = (
    "securerelease_pb2.py",
    "securerelease_pb2.pyi",
    "securerelease_pb2_grpc.py",
    "securerelease_pb2_grpc.pyi",
)


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # dev dependency, pinned

    # The mypy plugins come from this interpreter's own scripts directory, never from PATH, so
    # the check works in a fresh virtual environment that is not activated.
    scripts = Path(sysconfig.get_path("scripts"))
    plugins = {name: scripts / name for name in ("protoc-gen-mypy", "protoc-gen-mypy_grpc")}
    missing = [str(p) for p in plugins.values() if not p.exists()]
    if missing:
        raise SystemExit(f"mypy-protobuf plugins not installed: {missing}; pip install -e '.[dev]'")
    args = [
        "protoc",
        *(f"--plugin={name}={path}" for name, path in plugins.items()),
        f"-I{VIRTUAL}={PROTOS}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        f"{VIRTUAL}/{PROTO}",
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if regenerating gives a diff")
    args = parser.parse_args()
    target = PROTOS / "securerelease/v1"
    if not (PROTOS / PROTO).is_file():
        raise SystemExit(f"{PROTOS / PROTO} not found: regenerate from a checkout, not an installed package")
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / "secure_release/protos/securerelease/v1"
        stale = [
            n
            for n in GENERATED
            if not (target / n).exists() or not filecmp.cmp(fresh / n, target / n, shallow=False)
        ]
        if args.check:
            if stale:
                print(f"generated gRPC code is stale: {stale}; run python -m secure_release.protos.generate")
                return 1
            return 0
        for name in GENERATED:
            shutil.copyfile(fresh / name, target / name)
    print(f"regenerated {len(GENERATED)} files in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
