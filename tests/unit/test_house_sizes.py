"""The sizes the project promises: each document's page budget and each module's line limit.

:func:`find_oversized_pages`: docs/index.md has a section ``## Page sizes`` holding a table
``| page | at most |`` with one row `` | `path` | N KB | `` per page (the path relative to docs/, such
as ``scaling.md``, ``figures/report.md``, ``../README.md``; 1 KB = 1,000 bytes). Every markdown
file under docs/ has a row, every row names an existing file, no file is over its row's size, and
the README's row exists. Three budgets are promises of the project, checked here whatever the
table says: the README at most :data:`README_CAP_KB`, docs/scaling.md and docs/architectures.md at
most :data:`REFERENCE_PAGE_CAP_KB` each.

:func:`find_long_modules`: CONTRIBUTING.md states the limit (``**Module size.** A module is at most
N lines``); every Python file of the repository longer than that is listed, with the reason it is
one module, in tests/long_modules.toml (``[modules]``, ``"path/to/file.py" = "reason"``), and every
entry there names an existing file that is over the limit (a file split since is removed from the
list) and gives a reason of at least :data:`MIN_REASON_WORDS` words. Not counted: virtual
environments (``.venv*``), ``build/``, ``.git/``, caches, and the generated protobuf modules.
"""

from __future__ import annotations

import posixpath
import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: The project's promises (README: "a short page"; the two reference pages each read in one
#: sitting): the caps hold even if the table in docs/index.md is raised.
README_CAP_KB = 10
REFERENCE_PAGE_CAP_KB = 25
CAPPED_PAGES = {
    "../README.md": README_CAP_KB,
    "scaling.md": REFERENCE_PAGE_CAP_KB,
    "architectures.md": REFERENCE_PAGE_CAP_KB,
}

SIZE_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(\d+(?:\.\d+)?)\s*KB\s*\|\s*$")
TABLE_RULE = re.compile(r"^\|[\s:|-]+\|\s*$")
TABLE_HEAD = re.compile(r"^\|\s*page\s*\|\s*at most\s*\|\s*$")
ROW_FORMAT = "| `path relative to docs/` | N KB |"


def _page_rows(index: Path) -> tuple[list[tuple[int, str, float]], list[str]]:
    """The rows (line, page, KB) of the ``## Page sizes`` table, and what is wrong with its shape."""
    lines = index.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"^##\s+Page sizes\s*$", line)]
    if not starts:
        return [], ["docs/index.md: no section '## Page sizes' (a table '| page | at most |', one row per page)"]
    rows, problems, seen_head = [], [], False
    for number, line in enumerate(lines[starts[0] + 1 :], start=starts[0] + 2):
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            continue
        if TABLE_HEAD.match(line):
            seen_head = True
        elif match := SIZE_ROW.match(line):
            rows.append((number, match.group(1), float(match.group(2))))
        elif not TABLE_RULE.match(line):
            problems.append(f"docs/index.md:{number}: row {line.strip()!r} is not of the form {ROW_FORMAT}")
    if not seen_head:
        problems.append("docs/index.md: the '## Page sizes' section has no table head '| page | at most |'")
    return rows, problems


def find_oversized_pages(root: Path) -> list[str]:
    """Every page without a budget, over its budget or over a promised cap (module docstring)."""
    docs = root / "docs"
    rows, found = _page_rows(docs / "index.md")
    if not rows and found:
        return found  # no table at all: one message, not one a page
    budgets: dict[Path, tuple[int, str, float]] = {}
    for number, page, kb in rows:
        where = f"docs/index.md:{number}"
        file = (docs / page).resolve()
        if file in budgets:
            found.append(f"{where}: `{page}` has a row already (line {budgets[file][0]}): one row per page")
        elif not file.is_file():
            found.append(f"{where}: `{page}` names no file (paths are relative to docs/): remove the row or fix it")
        else:
            budgets[file] = (number, page, kb)
            size = file.stat().st_size
            if size > kb * 1000:
                shown = posixpath.normpath(f"docs/{page}")
                found.append(f"{shown}: {size:,} bytes, over its budget of {kb:g} KB ({where}): shorten it")
        cap = CAPPED_PAGES.get(page)
        if cap is not None and kb > cap:
            found.append(f"{where}: `{page}` may have at most {cap} KB (a promise of the project), not {kb:g}")
    for markdown in sorted(docs.rglob("*.md")):
        if markdown.resolve() not in budgets:
            rel = markdown.relative_to(docs).as_posix()
            found.append(f"docs/{rel}: no row in docs/index.md's '## Page sizes': add | `{rel}` | N KB |")
    if rows and (docs / "../README.md").resolve() not in budgets:
        found.append(f"docs/index.md: no row for `../README.md` (at most {README_CAP_KB} KB): add it")
    return found


def test_every_page_is_within_its_budget() -> None:
    found = find_oversized_pages(ROOT)
    assert not found, "\n" + "\n".join(found)


def _fake_docs(root: Path, table_rows: str) -> None:
    (root / "docs" / "figures").mkdir(parents=True)
    (root / "README.md").write_text("r" * 900)
    (root / "docs" / "scaling.md").write_text("s" * 2500)
    (root / "docs" / "figures" / "report.md").write_text("f" * 100)
    (root / "docs" / "index.md").write_text(
        "# Documentation\n\n## Page sizes\n\n| page | at most |\n|---|---|\n"
        + table_rows
        + "\n## History\n\n| x | y |\n"
    )


CLEAN_ROWS = (
    "| `index.md` | 1 KB |\n| `scaling.md` | 3 KB |\n| `figures/report.md` | 1 KB |\n| `../README.md` | 1 KB |\n"
)


def test_a_clean_fake_page_table_passes(tmp_path: Path) -> None:
    _fake_docs(tmp_path, CLEAN_ROWS)
    assert find_oversized_pages(tmp_path) == []


def test_planted_page_size_violations_are_caught(tmp_path: Path) -> None:
    _fake_docs(
        tmp_path,
        "| `index.md` | 1 KB |\n| `scaling.md` | 2 KB |\n| `gone.md` | 5 KB |\n| `index.md` | 1 KB |\n"
        "| `../README.md` | 12 KB |\n| figures/report.md | about 1 KB |\n",
    )
    (tmp_path / "docs" / "new.md").write_text("n")
    assert find_oversized_pages(tmp_path) == [
        "docs/index.md:12: row '| figures/report.md | about 1 KB |' is not of the form "
        "| `path relative to docs/` | N KB |",
        "docs/scaling.md: 2,500 bytes, over its budget of 2 KB (docs/index.md:8): shorten it",
        "docs/index.md:9: `gone.md` names no file (paths are relative to docs/): remove the row or fix it",
        "docs/index.md:10: `index.md` has a row already (line 7): one row per page",
        "docs/index.md:11: `../README.md` may have at most 10 KB (a promise of the project), not 12",
        "docs/figures/report.md: no row in docs/index.md's '## Page sizes': add | `figures/report.md` | N KB |",
        "docs/new.md: no row in docs/index.md's '## Page sizes': add | `new.md` | N KB |",
    ]
    (tmp_path / "docs" / "index.md").write_text("# Documentation\n")
    assert find_oversized_pages(tmp_path) == [
        "docs/index.md: no section '## Page sizes' (a table '| page | at most |', one row per page)"
    ]


def test_a_page_table_without_the_readme_is_caught(tmp_path: Path) -> None:
    _fake_docs(tmp_path, CLEAN_ROWS.replace("| `../README.md` | 1 KB |\n", ""))
    assert find_oversized_pages(tmp_path) == ["docs/index.md: no row for `../README.md` (at most 10 KB): add it"]


# -- modules ---------------------------------------------------------------------------------------

LONG_MODULES = "tests/long_modules.toml"
MIN_REASON_WORDS = 5
LIMIT_SENTENCE = re.compile(r"\*\*Module size\.\*\*\s+A module is at most\s+([\d,]+)\s+lines")
SKIPPED_DIRS = {".git", "build", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")


def module_limit(root: Path) -> int | None:
    """N of CONTRIBUTING.md's ``**Module size.** A module is at most N lines`` (None: no such line)."""
    for line in (root / "CONTRIBUTING.md").read_text(encoding="utf-8").splitlines():
        if match := LIMIT_SENTENCE.search(line):
            return int(match.group(1).replace(",", ""))
    return None


def python_files(root: Path) -> list[Path]:
    """Every hand-written Python file of the repository (no venvs, build, caches, generated protobuf)."""
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(part in SKIPPED_DIRS or part.startswith(".venv") or part.endswith(".egg-info") for part in parts[:-1]):
            continue
        if not GENERATED.search(path.name):
            files.append(path)
    return files


def line_count(path: Path) -> int:
    """Lines as ``wc -l`` counts them, plus a last line without its newline."""
    data = path.read_bytes()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _long_module_entries(root: Path) -> tuple[dict[str, Any], list[str]]:
    listing = root / LONG_MODULES
    if not listing.is_file():
        return {}, []
    try:
        table = tomllib.loads(listing.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        return {}, [f"{LONG_MODULES}: not TOML ({exc})"]
    modules = table.get("modules", {})
    if not isinstance(modules, dict) or set(table) - {"modules"}:
        return {}, [f'{LONG_MODULES}: holds one table [modules] of "path.py" = "reason", nothing else']
    return modules, []


def find_long_modules(root: Path) -> list[str]:
    """Every module over the limit without a listed reason, and every stale or thin entry (docstring)."""
    limit = module_limit(root)
    if limit is None:
        return [
            "CONTRIBUTING.md: no line '**Module size.** A module is at most N lines': "
            "the limit this check enforces is stated there"
        ]
    entries, found = _long_module_entries(root)
    long = {path.relative_to(root).as_posix(): line_count(path) for path in python_files(root)}
    long = {rel: lines for rel, lines in long.items() if lines > limit}
    for rel, reason in entries.items():
        file = root / rel
        if not file.is_file():
            found.append(f"{LONG_MODULES}: {rel!r} names no file: remove the entry")
        elif rel not in long:
            found.append(
                f"{LONG_MODULES}: {rel!r} has {line_count(file)} lines, within the limit of {limit}: remove the entry"
            )
        if not isinstance(reason, str) or len(reason.split()) < MIN_REASON_WORDS:
            found.append(
                f"{LONG_MODULES}: {rel!r}: the reason {reason!r} is too short: say in at least "
                f"{MIN_REASON_WORDS} words why it is one module"
            )
    for rel, lines in sorted(long.items()):
        if rel not in entries:
            found.append(
                f"{rel}: {lines} lines, over the limit of {limit} (CONTRIBUTING.md): split it, or list it "
                f"in {LONG_MODULES} with the reason it is one module"
            )
    return found


def test_every_long_module_has_its_reason() -> None:
    found = find_long_modules(ROOT)
    assert not found, "\n" + "\n".join(found)


def _fake_repo(root: Path, listing: str) -> None:
    (root / "tests").mkdir()
    (root / "pkg").mkdir()
    (root / "CONTRIBUTING.md").write_text(
        "## Rules\n\n- **Module size.** A module is at most 10 lines; longer ones are listed.\n"
    )
    (root / "pkg" / "short.py").write_text("x = 1\n" * 10)
    (root / "pkg" / "long.py").write_text("x = 1\n" * 11)
    for skipped in (".venv/lib", ".venv-oldest", "build/lib", "pkg/__pycache__"):
        (root / skipped).mkdir(parents=True, exist_ok=True)
        (root / skipped / "big.py").write_text("x = 1\n" * 50)
    (root / "pkg" / "api_pb2.py").write_text("x = 1\n" * 50)
    (root / "pkg" / "api_pb2_grpc.py").write_text("x = 1\n" * 50)
    (root / LONG_MODULES).write_text(listing)


CLEAN_LISTING = '[modules]\n"pkg/long.py" = "one state machine whose steps share private state"\n'


def test_a_clean_fake_module_listing_passes(tmp_path: Path) -> None:
    _fake_repo(tmp_path, CLEAN_LISTING)
    assert find_long_modules(tmp_path) == []


def test_planted_module_size_violations_are_caught(tmp_path: Path) -> None:
    _fake_repo(tmp_path, '[modules]\n"pkg/short.py" = "it is long for good reasons"\n"pkg/gone.py" = "too short"\n')
    (tmp_path / "pkg" / "tail.py").write_text("x = 1\n" * 10 + "y = 2")  # 11 lines, the last without "\n"
    assert find_long_modules(tmp_path) == [
        "tests/long_modules.toml: 'pkg/short.py' has 10 lines, within the limit of 10: remove the entry",
        "tests/long_modules.toml: 'pkg/gone.py' names no file: remove the entry",
        "tests/long_modules.toml: 'pkg/gone.py': the reason 'too short' is too short: say in at least 5 words "
        "why it is one module",
        "pkg/long.py: 11 lines, over the limit of 10 (CONTRIBUTING.md): split it, or list it in "
        "tests/long_modules.toml with the reason it is one module",
        "pkg/tail.py: 11 lines, over the limit of 10 (CONTRIBUTING.md): split it, or list it in "
        "tests/long_modules.toml with the reason it is one module",
    ]


def test_a_missing_limit_sentence_is_caught(tmp_path: Path) -> None:
    _fake_repo(tmp_path, CLEAN_LISTING)
    (tmp_path / "CONTRIBUTING.md").write_text("## Rules\n\nModules are short.\n")
    assert find_long_modules(tmp_path) == [
        "CONTRIBUTING.md: no line '**Module size.** A module is at most N lines': the limit this check enforces "
        "is stated there"
    ]
