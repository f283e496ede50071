"""Documentation links resolve: every citation of ``docs/definitions.md#anchor`` in the code, the
tests, the benchmarks and the Markdown files names a heading that exists (GitHub's anchor rule),
every relative Markdown link between the documents points at a file that exists (and, with a
``#fragment``, at a heading of it), and nothing cites the old internal document that users could
not open."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DEFINITIONS = DOCS / "definitions.md"
THIS = Path(__file__).resolve()

#: folders whose files may cite the definitions (as ``docs/definitions.md#anchor``)
CODE_DIRS = ("src", "tests", "benchmarks")
#: Markdown files outside ``docs/`` that are read on GitHub
TOP_MARKDOWN = ("README.md", "REPRODUCTION.md")
TEXT_SUFFIXES = {".py", ".md", ".rst", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".json"}
SKIP_DIRS = {"__pycache__", ".git", ".venv", "node_modules"}

#: ``docs/definitions.md#anchor`` written out in a comment, docstring or message
CODE_LINK = re.compile(r"docs/definitions\.md#([\w-]+)")
#: an inline Markdown link or image ``[text](target)`` / ``[text](target "title")``
MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
OLD_CITATION = re.compile(r"\bSPEC\b|SPEC\.md")

#: fewer links than this means the scan itself is broken (the test would pass vacuously)
MIN_DEFINITION_LINKS = 40


def github_slug(heading: str) -> str:
    """GitHub's automatic heading anchor: markup reduced to its text, lowercased, every character
    that is not a letter, digit, space, ``-`` or ``_`` dropped, spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) → text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _lines_outside_code(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a Markdown text, skipping fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def anchors(markdown: Path) -> set[str]:
    """Every anchor GitHub generates for the headings of ``markdown`` (a repeated heading gets
    ``-1``, ``-2``, … on its second, third, … occurrence)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _lines_outside_code(markdown.read_text(encoding="utf-8")):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def _text_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(ROOT).parts
        if any(p in SKIP_DIRS or p.endswith(".egg-info") for p in rel):
            continue
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            yield path


def _code_files() -> list[Path]:
    """Text files of src/, tests/ and benchmarks/, this file excepted (its examples are not
    citations)."""
    return [p for d in CODE_DIRS for p in _text_files(ROOT / d) if p.resolve() != THIS]


def _markdown_files() -> list[Path]:
    return [ROOT / name for name in TOP_MARKDOWN if (ROOT / name).exists()] + sorted(
        DOCS.glob("*.md"))


def _markdown_links(markdown: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of the relative links of a Markdown file (no URLs, no e-mail)."""
    for number, line in _lines_outside_code(markdown.read_text(encoding="utf-8")):
        for m in MD_LINK.finditer(INLINE_CODE.sub("", line)):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, …
                continue
            yield number, target


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def definition_links() -> list[tuple[str, str]]:
    """(where, anchor) of every link to an anchor of docs/definitions.md outside that file."""
    found: list[tuple[str, str]] = []
    for path in _code_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            found += [(_where(path, number), a) for a in CODE_LINK.findall(line)]
    for md in _markdown_files():
        if md == DEFINITIONS:
            continue
        for number, target in _markdown_links(md):
            file, _, fragment = target.partition("#")
            if file and (md.parent / file).resolve() == DEFINITIONS and fragment:
                found.append((_where(md, number), fragment))
    return found


def test_github_slug_rule() -> None:
    assert github_slug("Noise level and pixel scale") == "noise-level-and-pixel-scale"
    assert github_slug("95% interval") == "95-interval"
    assert github_slug("ShOp and ShPred") == "shop-and-shpred"
    assert github_slug("hr_sharpness_vs_length") == "hr_sharpness_vs_length"
    assert github_slug("Sparse-frequent task") == "sparse-frequent-task"
    assert github_slug("`demo` (paper 1, §5)") == "demo-paper-1-5"


def test_duplicate_headings_get_numbered(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text("# A\n## Setup\n```\n# not a heading\n```\n### Setup\n#### Setup\n")
    assert anchors(md) == {"a", "setup", "setup-1", "setup-2"}


def test_every_definitions_link_resolves() -> None:
    targets = anchors(DEFINITIONS)
    links = definition_links()
    assert len(links) >= MIN_DEFINITION_LINKS, (
        f"only {len(links)} links to docs/definitions.md#… found: is the scan broken?")
    broken = [f"{where}: #{anchor}" for where, anchor in links if anchor not in targets]
    assert not broken, "links to missing anchors of docs/definitions.md:\n" + "\n".join(broken)


def test_definitions_internal_links_resolve() -> None:
    targets = anchors(DEFINITIONS)
    links = [(n, t[1:]) for n, t in _markdown_links(DEFINITIONS) if t.startswith("#")]
    assert links, "docs/definitions.md has no table of contents?"
    broken = [f"{_where(DEFINITIONS, n)}: #{a}" for n, a in links if a not in targets]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("markdown", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_markdown_links_resolve(markdown: Path) -> None:
    """Every relative link of README.md, REPRODUCTION.md and docs/*.md names an existing file,
    and a ``#fragment`` into a Markdown file names one of its headings."""
    broken = []
    for number, target in _markdown_links(markdown):
        file, _, fragment = target.partition("#")
        dest = (markdown.parent / file).resolve() if file else markdown
        if not dest.exists():
            broken.append(f"{_where(markdown, number)}: {target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{_where(markdown, number)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_no_citations_of_the_old_internal_spec() -> None:
    """Citations go to docs/definitions.md, which ships with the repository; the internal SPEC
    document does not, so "SPEC §n" or "SPEC.md" would send readers nowhere."""
    files = _code_files() + _markdown_files()
    hits = [
        f"{_where(path, number)}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if OLD_CITATION.search(line)
    ]
    assert not hits, "citations of the internal SPEC document:\n" + "\n".join(hits)
