"""The docs hold what they promise: short, current, runnable, and linked to files that exist.

README.md is for users and describes the current state; bench/README.md explains the benches;
docs/ holds the code's layout and the bytes on disk.  None of them carries history (dates, commit
hashes, issue numbers): git and the issue notes hold that.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

import lsmdb

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCH_README = ROOT / "bench" / "README.md"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
API = ROOT / "docs" / "API.md"

README_MAX_LINES = 300
BENCH_README_MAX_LINES = 250
READ_SECTION_MAX_LINES = 40

FENCE_RE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DATE_RE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
ISSUE_RE = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w/&(\[])#\d+\b", re.I)
# A commit hash as docs would cite it: 7 to 12 hex digits, at least one digit and one letter.
# Longer hex runs (hashes of keys, byte dumps) are data, and code blocks are not searched.
HASH_RE = re.compile(r"(?<![\w.])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}(?![\w])")


def text_of(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def history_free_docs() -> list[Path]:
    return [README, BENCH_README, *sorted((ROOT / "docs").glob("*.md"))]


def section(text: str, title: str) -> list[str]:
    """The lines of the ``## title`` section, its heading included, trailing blank lines not."""
    lines = text.splitlines()
    start = lines.index(f"## {title}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    body = lines[start:end]
    while body and not body[-1].strip():
        body.pop()
    return body


def without_code(text: str) -> str:
    """``text`` with its fenced code blocks and the targets of its links removed."""
    text = FENCE_RE.sub("", text)
    return LINK_RE.sub("", text)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.strip().lower()
    text = "".join(c for c in text
                   if c in "-_ " or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    body = FENCE_RE.sub("", text_of(path))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", body, re.M)}


# ------------------------------------------------------------------ sizes
def test_readme_is_short() -> None:
    n = len(text_of(README).splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES})"


def test_bench_readme_is_short() -> None:
    n = len(text_of(BENCH_README).splitlines())
    assert n <= BENCH_README_MAX_LINES, \
        f"bench/README.md has {n} lines (at most {BENCH_README_MAX_LINES})"


def test_how_a_read_works_is_short() -> None:
    n = len(section(text_of(README), "How a read works"))
    assert n <= READ_SECTION_MAX_LINES, \
        f"'How a read works' has {n} lines (at most {READ_SECTION_MAX_LINES})"


def test_section_helper_stops_at_the_next_section() -> None:
    text = "## A\none\n\n## B\ntwo\n"
    assert section(text, "A") == ["## A", "one"]
    assert section(text, "B") == ["## B", "two"]


# --------------------------------------------------------------- commands
def ci_command() -> str:
    """The command .ci/run runs (its one line that is neither a comment nor shell setup)."""
    lines = [line.strip() for line in text_of(ROOT / ".ci" / "run").splitlines()]
    commands = [line for line in lines
                if line and not line.startswith(("#", "set ", "cd "))]
    assert len(commands) == 1, commands
    return commands[0]


def sh_lines(text: str) -> list[str]:
    return [line for m in FENCE_RE.finditer(text) if m.group(1) == "sh"
            for line in m.group(2).splitlines()]


def test_readme_test_command_is_what_ci_runs() -> None:
    command = ci_command()
    assert "pytest" in command
    assert command in sh_lines(text_of(README)), \
        "README.md's test command differs from the one .ci/run runs"


def test_readme_headline_command() -> None:
    lines = sh_lines(text_of(README))
    headline = [line for line in lines if "bench.absent_keys" in line]
    assert headline == ["python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && "
                        ".venv/bin/python -m bench.absent_keys --quick"]


# ------------------------------------------------------------------- code
def python_blocks() -> list[str]:
    return [m.group(2) for m in FENCE_RE.finditer(text_of(README)) if m.group(1) == "python"]


def into(code: str, root: Path) -> str:
    """``code`` with every "/tmp/NAME" string literal moved under ``root``."""
    return re.sub(r"""(["'])/tmp/([^"']+)\1""",
                  lambda m: repr(str(root / m.group(2))), code)


def test_into_rewrites_tmp_paths(tmp_path: Path) -> None:
    assert into('open("/tmp/my-db")', tmp_path) == f"open({str(tmp_path / 'my-db')!r})"


def test_readme_has_python_examples() -> None:
    assert len(python_blocks()) >= 2  # the quick start and dbm/shelve


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs_twice(index: int, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Each example runs, and runs again on the same paths (the quick start's second run finds
    its table)."""
    code = into(python_blocks()[index], tmp_path)
    paths = re.findall(r"""["'](/[^"']*)["']""", code)
    assert paths and all(path.startswith(str(tmp_path)) for path in paths), paths
    outputs = []
    for _ in range(2):
        exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
        outputs.append(capsys.readouterr().out)
    assert outputs[0] and outputs[1]


def test_quick_start_creates_its_table_idempotently() -> None:
    quick_start = python_blocks()[0]
    assert 'create_table("events", exist_ok=True' in quick_start


def test_api_names_every_public_call() -> None:
    text = text_of(API)
    for name in dir(lsmdb.DB):
        if not name.startswith("_"):
            assert f"db.{name}" in text, f"docs/API.md does not mention db.{name}"
    for name in dir(lsmdb.Table):
        if not name.startswith("_"):
            assert name in text, f"docs/API.md does not mention Table.{name}"


def test_readme_links_the_api() -> None:
    assert "(docs/API.md)" in text_of(README)


# ---------------------------------------------------------------- history
@pytest.mark.parametrize("path", history_free_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_carry_no_history(path: Path) -> None:
    text = text_of(path)
    problems = [f"date {m.group()}" for m in DATE_RE.finditer(text)]
    prose = without_code(text)
    problems += [f"issue number {m.group()!r}" for m in ISSUE_RE.finditer(prose)]
    problems += [f"commit-hash-like word {m.group()!r}" for m in HASH_RE.finditer(prose)]
    assert not problems, f"{path.relative_to(ROOT)}: {problems}"


def test_history_patterns_catch_what_they_should() -> None:
    prose = without_code("at 4092d8a (issue #7), on 2026-12-01; see [x](#5-filter-block)\n"
                         "```\n0xe6c632b61e964e1f 3b2a1c4\n```\n")
    assert HASH_RE.findall(prose) == ["4092d8a"]
    assert [m.group() for m in ISSUE_RE.finditer(prose)] == ["issue #7"]
    assert DATE_RE.findall(prose) == ["2026-12-01"]
    assert not HASH_RE.findall("deadbeef, 1234567, 0x1a2b3c4d, users:0000000101")


# ------------------------------------------------------------------ links
@pytest.mark.parametrize("path", [README, ARCHITECTURE, API],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(path: Path) -> None:
    assert path.exists(), f"{path.relative_to(ROOT)} is missing"
    broken = []
    for target in LINK_RE.findall(FENCE_RE.sub("", text_of(path))):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


def test_slug_is_github_s() -> None:
    assert slug("`lsmdb.dbm` and `shelve`") == "lsmdbdbm-and-shelve"
    assert slug("5. Filter block") == "5-filter-block"
    assert slug("Export, import and Cassandra") == "export-import-and-cassandra"
