"""Every file a document cites exists in the repository.

The documents are README.md, CONTRIBUTING.md, CHANGELOG.md and docs/**/*.md. Checked:

- markdown links ``[text](target)`` that are not URLs: the target, relative to the document's
  folder, must exist, and a ``#fragment`` into a markdown file must name one of its anchors
  (an ``id="..."`` or a heading's slug);
- paths in inline code spans: a word with a ``/`` whose first folder is one of the
  repository's top-level folders, or that ends in a source or data suffix (``.py``, ``.md``,
  ``.proto``, ...), must exist relative to the repository root (or to the document's folder);
  so must an upper-case root document such as ``CONTRIBUTING.md``. Placeholders (``<id>``,
  ``{a,b}``, ``$VAR``) are skipped and a glob must match at least one file.

Fenced code blocks are not read: they hold commands and example output, not citations.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SUFFIXES = (".py", ".md", ".proto", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".sh", ".csv", ".png", ".pyi")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
ROOT_DOC = re.compile(r"^[A-Z][A-Z_-]*\.md$")
SKIP = re.compile(r"[<>{}$|\[\]]|\.\.\.|…")


def documents(root: Path) -> list[Path]:
    docs = [root / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md") if (root / name).is_file()]
    return docs + sorted((root / "docs").rglob("*.md"))


def anchors(doc: Path) -> set[str]:
    """The fragment names a markdown file defines: explicit ids and GitHub heading slugs."""
    text = doc.read_text(encoding="utf-8")
    found = set(re.findall(r"""\bid=["']([^"']+)["']""", text))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        found.add(slug)
    return found


def _exists(candidate: str, root: Path, doc: Path) -> bool:
    if "*" in candidate or "?" in candidate:
        return any(root.glob(candidate)) or any(doc.parent.glob(candidate))
    return (root / candidate).exists() or (doc.parent / candidate).exists()


def code_paths(span: str, top: set[str]) -> list[str]:
    """The words of one inline code span that cite a file or folder of the repository."""
    paths = []
    for word in span.split():
        word = word.strip("\"'(),;:").removeprefix("./")
        word = word.split("=", 1)[1] if re.match(r"^[A-Z_]+=", word) else word
        if not word or SKIP.search(word) or "://" in word or word.startswith(("/", "~", "-")):
            continue
        cites_repo = "/" in word and (word.split("/", 1)[0] in top or word.rstrip("/").endswith(SUFFIXES))
        if cites_repo or ROOT_DOC.match(word):
            paths.append(word)
    return paths


def missing_citations(root: Path, docs: list[Path]) -> list[str]:
    """'doc: cited path' for every citation in ``docs`` that names nothing in ``root``."""
    top = {p.name for p in root.iterdir() if p.is_dir() and p.name not in {".git", ".venv", "build"}}
    bad = []
    for doc in docs:
        text = FENCE.sub("", doc.read_text(encoding="utf-8"))
        rel = doc.relative_to(root)
        for match in LINK.finditer(text):
            target = match.group(1) or match.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            path, _, fragment = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                bad.append(f"{rel}: link {target}")
            elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                bad.append(f"{rel}: link {target} (no such anchor)")
        for match in CODE.finditer(LINK.sub("", text)):
            bad += [f"{rel}: `{p}`" for p in code_paths(match.group(2), top) if not _exists(p, root, doc)]
    return bad


def test_every_cited_path_exists() -> None:
    docs = documents(ROOT)
    assert ROOT / "README.md" in docs and len(docs) > 5
    assert missing_citations(ROOT, docs) == []


def test_the_check_fails_on_a_planted_missing_path(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "cluster.py").write_text("")
    (tmp_path / "README.md").write_text("# Title\n")
    doc = tmp_path / "docs" / "page.md"
    doc.write_text(
        "## A heading\n"
        "Fine: `app/cluster.py`, [readme](../README.md#title), [here](#a-heading), `ledger.jsonl`,\n"
        "`agreement-<id>.json`, `app/*.py`, `python -m secure_release.protos.generate`.\n"
        "Planted: `app/cmd_demo.py`, `tests/test_x.py`, `seeds/001_x.txt`, `DESIGN.md`,\n"
        "[gone](gone.md), [bad anchor](../README.md#nowhere), `app/nothing/*.py`.\n"
        "```\nnot/read.py\n```\n"
    )
    found = missing_citations(tmp_path, [doc])
    assert found == [
        "docs/page.md: link gone.md",
        "docs/page.md: link ../README.md#nowhere (no such anchor)",
        "docs/page.md: `app/cmd_demo.py`",
        "docs/page.md: `tests/test_x.py`",
        "docs/page.md: `seeds/001_x.txt`",
        "docs/page.md: `DESIGN.md`",
        "docs/page.md: `app/nothing/*.py`",
    ]


def unlisted(root: Path) -> list[str]:
    """The documents under docs/ (and the root's) that docs/index.md does not link."""
    index = root / "docs" / "index.md"
    linked = {
        (index.parent / (m.group(1) or m.group(2)).split("#")[0]).resolve()
        for m in LINK.finditer(FENCE.sub("", index.read_text(encoding="utf-8")))
    }
    return sorted(str(d.relative_to(root)) for d in documents(root) if d != index and d.resolve() not in linked)


def test_the_index_lists_every_document() -> None:
    assert unlisted(ROOT) == []


def test_the_index_check_fails_on_a_planted_unlisted_document(tmp_path: Path) -> None:
    (tmp_path / "docs" / "history").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# Title\n")
    (tmp_path / "docs" / "listed.md").write_text("# Listed\n")
    (tmp_path / "docs" / "history" / "old.md").write_text("# Old\n")
    (tmp_path / "docs" / "forgotten.md").write_text("# Forgotten\n")
    (tmp_path / "docs" / "index.md").write_text(
        "1. [../README.md](../README.md)\n2. [listed.md](listed.md#listed)\n- [old](history/old.md)\n"
        "```\n[forgotten.md](forgotten.md)\n```\n"
    )
    assert unlisted(tmp_path) == ["docs/forgotten.md"]
