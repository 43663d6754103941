"""The documentation stands on its own: it points at nothing outside the repository, its links and
anchors resolve, and docs/cli.md lists exactly the commands of the ``replay`` app."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import typer.main

from replay.cli import app

ROOT = Path(__file__).resolve().parents[2]

# Written in pieces so that this file does not match itself.
FORBIDDEN = ("SPEC" + ".md", "SPEC" + " section", ".." + "/shared")

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1", flags=re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", flags=re.M)


def repository_files() -> list[Path]:
    """Tracked files, and new ones not ignored yet, that exist in the work tree."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git work tree")
    paths = [ROOT / name for name in listing.decode().split("\0") if name]
    return [path for path in paths if path.is_file()]


def doc_pages() -> list[Path]:
    """README.md, docs/*.md and the folders' READMEs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*/README.md"))]


def prose(text: str) -> str:
    """Markdown without fenced code blocks and code spans (neither holds links or headings)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page; repeated headings get GitHub's -1, -2, ... suffixes."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """Relative links of a page whose file does not exist, or whose ``#anchor`` names no heading there."""
    problems = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):
            continue  # http:, https:, mailto: ...
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{page.name}: {target}: no heading #{anchor} in {linked.name}")
    return problems


def test_nothing_points_outside_the_repository() -> None:
    offenders = []
    for path in repository_files():
        data = path.read_bytes()
        offenders += [f"{path.relative_to(ROOT)}: {word}" for word in FORBIDDEN if word.encode() in data]
    assert offenders == [], "the repository must stand on its own; point at the docs/ page instead"


def test_links_and_anchors_resolve() -> None:
    problems = [problem for page in doc_pages() for problem in broken_links(page)]
    assert problems == []


def test_the_test_files_named_anywhere_exist() -> None:
    """A page, comment or docstring that names a file under ``tests/`` names one that is there (they moved once)."""
    named = re.compile(rb"(?<![\w/.-])tests/[\w/]*\.py\b")
    missing = [
        f"{path.relative_to(ROOT)}: {name.decode()}"
        for path in repository_files()
        for name in sorted(set(named.findall(path.read_bytes())))
        if not (ROOT / name.decode()).is_file()
    ]
    assert missing == []


def test_the_doc_pages_and_anchors_named_in_code_exist() -> None:
    """A comment or docstring that points at a page (``docs/<page>.md``) or a section of one
    (``...#<anchor>``) points at a page that is there and at one of its headings: headings get
    renamed, and the code's pointers do not show in the pages' own link check."""
    named = re.compile(rb"(?<![\w/.-])docs/([\w-]+\.md)(?:#([\w-]+))?")
    missing = [
        f"{path.relative_to(ROOT)}: docs/{page.decode()}{'#' + anchor.decode() if anchor else ''}"
        for path in repository_files()
        if path.suffix == ".py"
        for page, anchor in sorted(set(named.findall(path.read_bytes())))
        if not (ROOT / "docs" / page.decode()).is_file()
        or (anchor and anchor.decode() not in anchors(ROOT / "docs" / page.decode()))
    ]
    assert missing == []


def test_slug_follows_github() -> None:
    assert slug("Incremental runs, crashes and late joiners") == "incremental-runs-crashes-and-late-joiners"
    assert slug("`replay digest`") == "replay-digest"
    assert slug("Copies, duplicates and conflicts") == "copies-duplicates-and-conflicts"
    assert slug("The wm_key (E_k)") == "the-wm_key-e_k"


def test_a_planted_bad_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\n## Real heading\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#real-heading) [gone](missing.md) [bad](a.md#no-such) [code](a.md#not-a-heading)\n"
        "`[in a code span](x.md)` [web](https://example.com/x.md) [self](#b)\n\n# B\n"
    )
    assert broken_links(page) == [
        "b.md: missing.md: no such file",
        "b.md: a.md#no-such: no heading #no-such in a.md",
        "b.md: a.md#not-a-heading: no heading #not-a-heading in a.md",
    ]


def documented_commands() -> set[str]:
    """``replay <command>`` at the start of a line in code blocks, or opening a code span, in docs/cli.md."""
    text = (ROOT / "docs" / "cli.md").read_text()
    fenced = "\n".join(match.group(0) for match in FENCE.finditer(text))
    in_code = set(re.findall(r"(?m)^\s*(?:\.venv/bin/)?replay ([a-z][\w-]*)", fenced))
    inline = set(re.findall(r"`replay ([a-z][\w-]*)", FENCE.sub("", text)))
    return in_code | inline


def test_cli_page_lists_exactly_the_commands() -> None:
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    documented = documented_commands()
    assert documented - commands == set(), "docs/cli.md names commands the app does not have"
    assert commands - documented == set(), "commands missing from docs/cli.md"
    headings = anchors(ROOT / "docs" / "cli.md")
    assert {f"replay-{name}" for name in commands} <= headings, "every command has its own section"
