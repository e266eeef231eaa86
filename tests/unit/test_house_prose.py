"""The documents speak in the present tense and cite no issue numbers (CONTRIBUTING.md, "A document").

Read: README.md, CONTRIBUTING.md and every ``docs/**/*.md``. CHANGELOG.md is not read: history lives
there. :func:`find_history_and_issue_numbers` reports, as ``file:line: what (what is allowed)``:

Issue numbers (case-insensitive unless said otherwise):

- ``issue 12``, ``issues 3``, ``issue #12`` (``\\bissues?\\s*#?\\d+``) and ``pull request 7``; ``PR 7``,
  ``PR#7`` in capitals only (lower-case ``pr`` followed by a digit is too often something else).
  These are read everywhere, fenced code blocks and inline code included: a command or an example
  cites no issue either.
- a bare ``#12`` in prose only: not in code (a colour ``#333``, a shell comment), not in a link's
  target or a URL (an anchor such as ``(#3-the-protocol)``), not in an HTML entity (``&#8212;``).

History phrasing (anywhere; the words may wrap across a line break):

- ``before/after this|that change|round|issue|fix`` and ``before/after the round|issue|fix``: "after
  the change" alone is not flagged, since a reference page says what happens after a certificate or
  a setting changes;
- ``this round``, ``last round``, ``previous round``, ``earlier round``: measurements of a round of
  work belong in CHANGELOG.md's "Measurement history";
- ``(before:``, ``(before,``, ``(before;``, ``(before)``, ``(before this``, ``(before that``: a former
  figure in parentheses; ``(before the agreement)`` names a moment of the protocol and passes;
- ``used to be``.

``no longer`` is allowed: "a release that can no longer change" states a present property. The list
is short on purpose: a check that flags honest present-tense prose gets switched off.

The links check (every relative link and cited path resolves) is tests/unit/test_doc_links.py; its
planted test hands it one document, so :func:`test_the_link_check_reads_the_root_documents_and_nested_pages`
below plants broken links in the root documents and a nested page and lets it find them itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import test_doc_links as doc_links

ROOT = Path(__file__).resolve().parents[2]

#: (pattern, what it found, what is allowed instead), read over the whole text, code included.
EVERYWHERE: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"\bissues?\s*#?\d+", re.I), "an issue number", "name the thing, not its issue"),
    (re.compile(r"\bpull\s+request\s*#?\d+", re.I), "a pull request number", "name the thing"),
    (re.compile(r"\bPR\s*#?\d+"), "a pull request number", "name the thing"),
    (
        re.compile(
            r"\b(?:before|after)\s+(?:(?:this|that)\s+(?:change|round|issue|fix)|the\s+(?:round|issue|fix))\b", re.I
        ),
        "history phrasing",
        "say what the code does now; the change goes to CHANGELOG.md",
    ),
    (
        re.compile(r"\b(?:this|last|previous|earlier)\s+round\b", re.I),
        "history phrasing",
        "state the current figure; rounds of measurements go to CHANGELOG.md's measurement history",
    ),
    (
        re.compile(r"\(before(?:\s*[:;,)]|\s+(?:this|that)\b)", re.I),
        "a former figure",
        "give the current one; the former goes to CHANGELOG.md",
    ),
    (re.compile(r"\bused\s+to\s+be\b", re.I), "history phrasing", "present tense; history goes to CHANGELOG.md"),
)

#: Read over the prose only (code, link targets and URLs blanked).
PROSE_ONLY: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"(?<![&\w])#\d+\b"), "an issue number", "name the thing, not its number"),
)

FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\n[ \t]*\n).)+?\1", re.S)  # a code span never crosses a paragraph
LINK_TARGET = re.compile(r"\]\([^)]*\)|\]:\s*\S+|\b(?:href|src|id)=\"[^\"]*\"|[a-z][a-z0-9+.-]*://\S+", re.I)


def checked_documents(root: Path) -> list[Path]:
    """README.md, CONTRIBUTING.md and docs/**/*.md (CHANGELOG.md holds the history)."""
    root_docs = [root / name for name in ("README.md", "CONTRIBUTING.md") if (root / name).is_file()]
    return root_docs + sorted((root / "docs").rglob("*.md"))


def _blank(text: str, start: int, end: int) -> str:
    """``text`` with ``[start, end)`` replaced by spaces, line breaks kept (offsets and lines stay)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def prose_only(text: str) -> str:
    """``text`` with fenced blocks, inline code, link targets and URLs blanked, same length."""
    lines = text.splitlines(keepends=True)
    fence: str | None = None
    kept = []
    for line in lines:
        opening = FENCE_LINE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            kept.append(re.sub(r"[^\n]", " ", line))
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            kept.append(re.sub(r"[^\n]", " ", line))
        else:
            kept.append(line)
    prose = "".join(kept)
    for pattern in (INLINE_CODE, LINK_TARGET):
        for match in list(pattern.finditer(prose)):
            prose = _blank(prose, match.start(), match.end())
    return prose


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def find_history_and_issue_numbers(root: Path) -> list[str]:
    """``path:line: found 'text': what it is (what to write instead)`` for every hit (module docstring)."""
    found = []
    for doc in checked_documents(root):
        text = doc.read_text(encoding="utf-8")
        rel = doc.relative_to(root).as_posix()
        hits = [(m, what, allowed) for pattern, what, allowed in EVERYWHERE for m in pattern.finditer(text)]
        prose = prose_only(text)
        taken = [range(m.start(), m.end()) for m, _, _ in hits]
        hits += [
            (m, what, allowed)
            for pattern, what, allowed in PROSE_ONLY
            for m in pattern.finditer(prose)
            if not any(m.start() in span for span in taken)  # "issue #49" is one hit, not two
        ]
        for match, what, allowed in sorted(hits, key=lambda hit: hit[0].start()):
            words = " ".join(match.group(0).split())
            found.append(f"{rel}:{_line_of(text, match.start())}: found {words!r}: {what} ({allowed})")
    return found


def test_the_documents_cite_no_issue_and_tell_no_history() -> None:
    assert len(checked_documents(ROOT)) > 5
    found = find_history_and_issue_numbers(ROOT)
    assert not found, "\n" + "\n".join(found)


def _fake_repo(root: Path, page: str) -> None:
    (root / "docs" / "figures").mkdir(parents=True)
    (root / "README.md").write_text("# Title\n\nA release that can no longer change is sealed.\n")
    (root / "CONTRIBUTING.md").write_text("# Contributing\n\nSee [the page](docs/page.md#3-the-protocol).\n")
    (root / "CHANGELOG.md").write_text("Fixed issue 12; this round 2x faster (before: 3 s). It used to be slow.\n")
    (root / "docs" / "figures" / "report.md").write_text("# Report\n\nColour `#333`, &#8212; a dash.\n")
    (root / "docs" / "page.md").write_text(page)


CLEAN_PAGE = (
    "# Page\n\n## 3 The protocol\n\n"
    "The next connection after the change is handshaken with the new certificate.\n"
    "A ledger the witness finds behind (before the agreement) refuses. See [here](#3-the-protocol),\n"
    '<a id="12"></a> and https://example.org/x#12; no longer sums exactly.\n'
    "```sh\ncurl -H 'color: #333' x  # 1. a comment\n```\n"
)


def test_a_clean_fake_repository_passes(tmp_path: Path) -> None:
    _fake_repo(tmp_path, CLEAN_PAGE)
    assert find_history_and_issue_numbers(tmp_path) == []


def test_planted_issue_numbers_and_history_are_caught(tmp_path: Path) -> None:
    _fake_repo(
        tmp_path,
        CLEAN_PAGE
        + "Fixed in Issue #49 and PR 7, see #12 and `issue 3`.\n"
        + "```\nsecure-release demo  # issue 41\n```\n"
        + "1.34 of DuckDB this round; the spool (before: 20 bytes) used to\nbe larger; before this\nchange it was.\n",
    )
    found = find_history_and_issue_numbers(tmp_path)
    assert found == [
        "docs/page.md:11: found 'Issue #49': an issue number (name the thing, not its issue)",
        "docs/page.md:11: found 'PR 7': a pull request number (name the thing)",
        "docs/page.md:11: found '#12': an issue number (name the thing, not its number)",
        "docs/page.md:11: found 'issue 3': an issue number (name the thing, not its issue)",
        "docs/page.md:13: found 'issue 41': an issue number (name the thing, not its issue)",
        "docs/page.md:15: found 'this round': history phrasing (state the current figure; rounds of "
        "measurements go to CHANGELOG.md's measurement history)",
        "docs/page.md:15: found '(before:': a former figure (give the current one; the former goes to CHANGELOG.md)",
        "docs/page.md:15: found 'used to be': history phrasing (present tense; history goes to CHANGELOG.md)",
        "docs/page.md:16: found 'before this change': history phrasing (say what the code does now; the change "
        "goes to CHANGELOG.md)",
    ]


def find_broken_links(root: Path) -> list[str]:
    """Every relative link or cited path of the documents that names nothing (tests/unit/test_doc_links.py)."""
    return doc_links.missing_citations(root, doc_links.documents(root))


def test_the_link_check_reads_the_root_documents_and_nested_pages(tmp_path: Path) -> None:
    _fake_repo(tmp_path, CLEAN_PAGE)
    assert find_broken_links(tmp_path) == []
    (tmp_path / "README.md").write_text("# Title\n\n[gone](docs/gone.md)\n")
    (tmp_path / "CONTRIBUTING.md").write_text("# Contributing\n\n[page](docs/page.md#no-such-heading)\n")
    (tmp_path / "docs" / "figures" / "report.md").write_text("# Report\n\n[up](../missing.md)\n")
    assert find_broken_links(tmp_path) == [
        "README.md: link docs/gone.md",
        "CONTRIBUTING.md: link docs/page.md#no-such-heading (no such anchor)",
        "docs/figures/report.md: link ../missing.md",
    ]
