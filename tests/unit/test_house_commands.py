"""Every command line the README and docs/own-data.md show is accepted by the program it runs.

Read: the shell blocks (a fence with no language, or ``sh``, ``bash``, ``shell``, ``console``,
``zsh``) of each file of :data:`COMMAND_DOCS`; ``python``, ``pycon``, ``text``, ``json`` and other
blocks hold code or output, not commands, and are skipped. In a block, a line ending in ``\\``
continues on the next; a ``$ `` prompt is dropped (in a block with prompts, only prompted lines are
commands: the others are output). A command is cut at a shell operator (a pipe, ``&``, ``;``, a
redirection), at a ``# comment`` and at ``...`` (the doc's "and the flags shown above"); leading
``VAR=value`` words are dropped; words are split as the shell splits them (``shlex``), and ``$VAR``
or ``"$(...)"`` stay opaque strings. Then:

- ``secure-release``, ``secure-release-curator``, ``secure-release-server`` and
  ``secure-release-researcher`` (also as ``.venv/bin/...`` or ``python -m secure_release...``) must
  be accepted by that program's own argparse parser (its ``build_parser()``, built in this process;
  the CLIs take ``--log-format`` and ``--metrics-listen`` out of argv before parsing, and so does
  this check). ``--help`` exits 0: accepted. A usage error (exit 2) is reported with argparse's
  message.
- ``make TARGET ...``: every target must be a rule of the Makefile.

Any other line (``docker compose``, ``dask worker``, output) is not read.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COMMAND_DOCS = ("README.md", "docs/own-data.md")
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console", "zsh"}
PROGRAMS = ("secure-release", "secure-release-curator", "secure-release-server", "secure-release-researcher")
#: ``python -m MODULE`` for each program (the packages' ``__main__`` and the CLI modules).
MODULES = {
    "secure_release": "secure-release",
    "secure_release.cli": "secure-release",
    "secure_release.curator": "secure-release-curator",
    "secure_release.curator.cli": "secure-release-curator",
    "secure_release.server": "secure-release-server",
    "secure_release.server.cli": "secure-release-server",
    "secure_release.researcher": "secure-release-researcher",
    "secure_release.researcher.cli": "secure-release-researcher",
}
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SUBSTITUTION = re.compile(r"\$\([^()]*\)")
OPERATOR = re.compile(r"^[();<>|&]+$")
ELISION = ("...", "…")


def shell_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, command) of every line of the shell blocks of ``text``, continuations joined."""
    fence: str | None = None
    shell = False
    block: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if fence is None:
            if opening := FENCE.match(line):
                fence, shell, block = opening.group(1), opening.group(2).lower() in SHELL_BLOCKS, []
            continue
        closing = line.strip()
        if closing.startswith(fence) and not closing.strip(fence[0]):
            if shell:
                yield from _commands(block)
            fence = None
            continue
        block.append((number, line))
    if fence is not None and shell:
        yield from _commands(block)


def _commands(block: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """The commands of one shell block: continuations joined, prompts dropped, output skipped."""
    prompted = any(line.lstrip().startswith("$ ") for _, line in block)
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in block:
        start, text = pending if pending else (number, "")
        text += line.rstrip()
        if text.endswith("\\"):
            pending = (start, text[:-1] + " ")
            continue
        pending = None
        joined.append((start, text))
    if pending:
        joined.append(pending)
    for number, line in joined:
        command = " ".join(line.split())
        if command.startswith("$ "):
            yield number, command[2:]
        elif not prompted:
            yield number, command


def command_words(line: str) -> list[str]:
    """The words of one command as the shell passes them, cut at an operator, comment or ``...``."""
    lexer = shlex.shlex(SUBSTITUTION.sub("SUBSTITUTION", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for word in lexer:
        if OPERATOR.match(word):
            if word[0] in "<>" and words and words[-1].isdigit():
                words.pop()  # the 2 of 2>&1
            break
        if word in ELISION:
            break
        words.append(word)
    while words and ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words


def program_and_args(words: list[str]) -> tuple[str, list[str]] | None:
    """(program, its arguments) if ``words`` run one of :data:`PROGRAMS` or ``make``, else None."""
    if not words:
        return None
    name = words[0].rsplit("/", 1)[-1]
    if name in PROGRAMS or name == "make":
        return name, words[1:]
    if re.fullmatch(r"python(3(\.\d+)?)?", name) and len(words) > 2 and words[1] == "-m" and words[2] in MODULES:
        return MODULES[words[2]], words[3:]
    return None


def make_targets(makefile: Path) -> set[str]:
    """The names of the Makefile's rules (not its variables, not pattern or special targets)."""
    targets: set[str] = set()
    for line in makefile.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([^\s:=#][^:=#]*?)\s*::?(?!=)", line)
        if match:
            targets.update(t for t in match.group(1).split() if "$" not in t and "%" not in t and not t.startswith("."))
    return targets


def program_parsers() -> dict[str, Callable[[list[str]], None]]:
    """Each program's argv check: its own parser, with the options its ``main`` takes out first."""
    from secure_release import cli as app_cli
    from secure_release.curator import cli as curator_cli
    from secure_release.infra import metrics
    from secure_release.infra.logs import pop_log_format
    from secure_release.researcher import cli as researcher_cli
    from secure_release.server import cli as server_cli

    def popping(parser: argparse.ArgumentParser) -> Callable[[list[str]], None]:
        def parse(argv: list[str]) -> None:
            rest, _ = metrics.pop_metrics_listen(pop_log_format(argv)[0])
            parser.parse_args(rest)

        return parse

    def direct(parser: argparse.ArgumentParser) -> Callable[[list[str]], None]:
        def parse(argv: list[str]) -> None:
            parser.parse_args(argv)

        return parse

    return {
        "secure-release": direct(app_cli.build_parser()),
        "secure-release-curator": popping(curator_cli.build_parser()),
        "secure-release-server": popping(server_cli.build_parser()),
        "secure-release-researcher": popping(researcher_cli.build_parser()),
    }


def usage_error(parse: Callable[[list[str]], None], argv: list[str]) -> str | None:
    """argparse's message if ``argv`` is refused (exit code other than 0), else None."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            parse(argv)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            lines = [line for line in err.getvalue().splitlines() if line.strip()]
            return lines[-1] if lines else f"exit code {exit_.code}"
    return None


def shown_commands(root: Path) -> Iterator[tuple[str, tuple[str, list[str]] | ValueError]]:
    """(``file:line: `command```, (program, argv) or why the shell cannot split it) for every shown
    command of a program or ``make``; other lines are skipped."""
    for doc in COMMAND_DOCS:
        for number, line in shell_lines((root / doc).read_text(encoding="utf-8")):
            where = f"{doc}:{number}: `{line}`"
            try:
                called = program_and_args(command_words(line))
            except ValueError as exc:  # unbalanced quotes: a command is reported, a diagram is not
                plain = line.split()
                while plain and ASSIGNMENT.match(plain[0]):
                    plain.pop(0)
                if program_and_args(plain) is not None:
                    yield where, exc
                continue
            if called is not None:
                yield where, called


def find_refused_command_lines(root: Path) -> list[str]:
    """``file:line: `command`: why`` for every shown command its program refuses (module docstring)."""
    parsers = program_parsers()
    targets = make_targets(root / "Makefile")
    found = []
    for where, called in shown_commands(root):
        if isinstance(called, ValueError):
            found.append(f"{where}: the shell cannot split it ({called})")
            continue
        program, argv = called
        if program == "make":
            for target in (word for word in argv if not word.startswith("-") and "=" not in word):
                if target not in targets:
                    found.append(f"{where}: no make target {target!r} (the Makefile has {sorted(targets)})")
        elif (message := usage_error(parsers[program], argv)) is not None:
            found.append(f"{where}: {message}")
    return found


def test_every_shown_command_line_parses() -> None:
    shown = {called[0] for _, called in shown_commands(ROOT) if not isinstance(called, ValueError)}
    # the how-to shows every program: if none is found, the reading (not the docs) is broken
    assert shown >= set(PROGRAMS), f"no command of {sorted(set(PROGRAMS) - shown)} read in {COMMAND_DOCS}"
    found = find_refused_command_lines(ROOT)
    assert not found, "\n" + "\n".join(found)


def _fake_repo(root: Path, readme_block: str) -> None:
    (root / "docs").mkdir()
    (root / "Makefile").write_text(
        "VENV ?= .venv\nSTAMP := $(VENV)/.installed\n.PHONY: demo test\n$(STAMP): pyproject.toml\n"
        "\techo x: y\ndemo: install\n\t$(VENV)/bin/secure-release demo\ntest install: $(STAMP)\n"
    )
    (root / "README.md").write_text(
        "# Title\n\n```sh\n" + readme_block + "```\n\n```text\nsecure-release nope: error\n```\n"
    )
    (root / "docs" / "own-data.md").write_text(
        "# Own data\n\n```\n$ secure-release-curator run --data people --engine dask \\\n"
        "    --workers 4 ...\nsecure-release-curator: output, not a command\n```\n"
        "```pycon\n>>> secure-release --no-such-flag\n```\n"
    )


CLEAN_BLOCK = (
    "make demo    # 1. build and run\n"
    "make test install\n"
    "secure-release --help\n"
    "secure-release plan --n 300 --alphabet 6,4 --epsilon 1.0 | tee plan.txt\n"
    'RELEASE_ID=r2 .venv/bin/secure-release-researcher fetch --release-id "$RELEASE_ID" --name r 2>&1 > out\n'
    'python -m secure_release.server --listen 127.0.0.1:0 --store "$(mktemp -d)" --log-format json &\n'
    "secure-release-curator --metrics-listen 127.0.0.1:9100 budget set --keystore ks --data a.csv \\\n"
    "    --epsilon 2.0 --certs certs/alice --name alice\n"
    "docker compose up --build    # not one of the programs\n"
    "python -m secure_release.protos.generate\n"
)


def test_a_clean_fake_readme_passes(tmp_path: Path) -> None:
    _fake_repo(tmp_path, CLEAN_BLOCK)
    assert find_refused_command_lines(tmp_path) == []


def test_planted_refused_command_lines_are_caught(tmp_path: Path) -> None:
    _fake_repo(
        tmp_path,
        CLEAN_BLOCK
        + "secure-release plan --n 300 --epsilon 1 --no-such-flag\n"
        + "secure-release frobnicate --n 3\n"
        + "python3 -m secure_release.curator.cli run --data a.csv \\\n  --engine spark\n"
        + "make tests\n"
        + "secure-release plan --question 'unbalanced\n",
    )
    found = find_refused_command_lines(tmp_path)
    assert len(found) == 5, found
    assert found[0].startswith("README.md:14: `secure-release plan --n 300 --epsilon 1 --no-such-flag`: ")
    assert found[0].endswith("unrecognized arguments: --no-such-flag")
    assert found[1].startswith("README.md:15: `secure-release frobnicate --n 3`: ")
    assert "invalid choice: 'frobnicate'" in found[1]
    assert found[2].startswith(
        "README.md:16: `python3 -m secure_release.curator.cli run --data a.csv --engine spark`: "
    )
    assert "argument --engine: invalid choice: 'spark'" in found[2]
    assert found[3].startswith("README.md:18: `make tests`: no make target 'tests' (the Makefile has ['demo', ")
    assert found[4] == (
        "README.md:19: `secure-release plan --question 'unbalanced`: the shell cannot split it (No closing quotation)"
    )
