"""The documentation holds together: every docs/ page is reachable from the README, and relative links resolve.

Style (lines of at most 120 characters, a table of contents on long pages, closed code fences, anchors that exist) is
checked on the landing pages and the reference pages listed in STYLED; pages added later join that list once they
follow it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
STYLED = ["README.md", "CONTRIBUTING.md", "docs/getting-started.md", "docs/configuration.md", "docs/modes.md",
          "docs/policy-shapes.md", "docs/backends-and-timing.md", "docs/tracking-and-sweeps.md", "docs/cases.md",
          "docs/troubleshooting.md", "docs/architecture.md", "docs/hardware/ascend.md", "docs/port-certificate.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links inside code are examples, not links)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = None
        elif fence is None:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text()))


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not - or _), spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
    return {f"{base}-{i}" if i else base for base, count in seen.items() for i in range(count)}


def test_docs_exist():
    assert PAGES, "docs/ has no pages"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_docs_page_is_linked_from_the_readme(page):
    linked = {(REPO / t.split("#")[0]).resolve() for t in links(REPO / "README.md") if relative(t)}
    assert page.resolve() in linked, f"README.md does not link {page.relative_to(REPO)}: add a line to its docs index"


@pytest.mark.parametrize("page", [REPO / "README.md", REPO / "CONTRIBUTING.md", *PAGES],
                         ids=["README.md", "CONTRIBUTING.md", *(str(p.relative_to(REPO)) for p in PAGES)])
def test_relative_links_resolve(page):
    assert page.is_file(), f"{page.relative_to(REPO)} is missing"
    broken = [t for t in links(page) if relative(t) and not (page.parent / t.split("#")[0]).exists()]
    assert not broken, f"{page.relative_to(REPO)} links to missing files: {broken}"


@pytest.mark.parametrize("name", STYLED)
def test_styled_pages_keep_the_house_style(name):
    page = REPO / name
    text = page.read_text()
    lines = text.splitlines()
    long = [i for i, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, f"{name}: lines over 120 characters: {long}"
    fences = [line for line in lines if FENCE.match(line)]
    assert len(fences) % 2 == 0, f"{name}: a code fence is not closed (a # comment after it would read as a heading)"
    if len(lines) > 200 and name != "README.md":
        assert re.search(r"^## Contents$", text, re.M), f"{name}: {len(lines)} lines and no '## Contents'"
    for target in links(page):
        file, _, anchor = target.partition("#")
        if not anchor or re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        dest = page if not file else (page.parent / file)
        if dest.suffix == ".md" and dest.is_file():
            assert anchor in anchors(dest), f"{name}: #{anchor} is not a heading of {dest.relative_to(REPO)}"


def test_readme_fits_on_a_few_screens():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


def test_ci_runs_the_readmes_two_commands():
    """The README's set-up installs what .ci/run installs, and its test command is the one .ci/run calls."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Two commands\n.*?```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no '## Two commands' section with a bash block"
    setup, tests = block.group(1).strip().splitlines()
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    install = re.search(r"pip install (.*?) &&", setup)
    assert install and any(line.endswith(f"pip install -q {install.group(1)}") for line in ci), setup
    assert setup.endswith("&& python run.py")
    assert tests in ci, f"{tests!r} is not a line of .ci/run"


def test_the_configuration_reference_is_what_its_generator_writes():
    """docs/configuration.md's key reference is generated from conf/*.yaml's comments: a key or comment changed without
    rerunning the generator fails here, naming the first line that differs."""
    import difflib
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    committed = generator.DOC.read_text()
    expected = generator.between(committed, generator.BEGIN, generator.END, generator.reference())
    diff = [line for line in difflib.unified_diff(committed.splitlines(), expected.splitlines(), "committed",
                                                  "generated", n=0, lineterm="") if line[:1] in "+-"]
    assert not diff, ("docs/configuration.md differs from its generator: run `python scripts/config_reference.py "
                      f"--write`; first lines: {diff[2:6]}")


def test_contributings_table_of_tests_names_every_test_file():
    """A new test file gets its row in CONTRIBUTING's table of the tests (a pattern such as `test_shapes*.py` counts)."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    rows = [line for line in text.split("## The tests", 1)[1].split("\n## ", 1)[0].splitlines() if line.startswith("| `")]
    patterns = [name for row in rows for name in re.findall(r"`(test_[\w*]+\.py)`", row.split(" | ")[0])]
    files = sorted(p.name for p in (REPO / "tests").glob("test_*.py"))
    missing = [f for f in files if not any(re.fullmatch(p.replace(".", r"\.").replace("*", ".*"), f) for p in patterns)]
    assert not missing, f"CONTRIBUTING.md's table of the tests has no row for {missing}"
