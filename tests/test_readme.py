"""The README is one screen for a newcomer (issue 38, item 5): "Install" near the top, the install and test commands
that CI runs, a link to every page of docs/, and none of the contributors' notes (dated timings, pkill, ../shared
paths), which live in docs/notebook.md. Every relative link of the README and docs/*.md names a file that exists
and, after a '#', one of its headings; the Client API page's diff is its two scripts' own."""

import re

from .conftest import REPO

FENCE = re.compile(r"^ {0,3}(```|~~~)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")


def readme():
    return (REPO / "README.md").read_text(encoding="utf-8")


def prose_lines(text, keep_code=False):
    """(line number, line) outside fenced code, with inline code blanked unless ``keep_code``."""
    inside = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, line if keep_code else re.sub(r"`[^`\n]*`", "", line)


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    for _, line in prose_lines(path.read_text(encoding="utf-8"), keep_code=True):
        match = HEADING.match(line)
        if match:
            name = anchor(match.group(1))
            found.add(name if name not in seen else f"{name}-{seen[name]}")
            seen[name] = seen.get(name, 0) + 1
    return found


def test_install_is_within_the_first_30_lines():
    lines = readme().split("\n")
    assert "## Install" in lines[:30]


def test_the_readme_gives_the_commands_ci_runs():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    text = readme()
    assert ci.strip().split("\n")[-1] == "python -m pytest -q"
    assert 'pip install -e ".[test]" && python -m pytest -q' in text
    torch_pair = re.search(r"pip install -q (torch==\S+ torchvision==\S+)", ci).group(1)
    assert f"pip install {torch_pair} --index-url https://download.pytorch.org/whl/cpu" in text


def test_the_readme_links_every_docs_page():
    linked = {m.group(1).partition("#")[0] for _, line in prose_lines(readme()) for m in LINK.finditer(line)}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages - linked == set()


def test_the_readme_holds_no_contributors_notes():
    text = readme()
    for note in ("pkill", "../shared", "nice -n"):
        assert note not in text, note
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", text) == []  # dated timings and status go to docs/notebook.md


def broken_links(pages, root):
    """A line for every relative link of ``pages`` whose file does not exist or whose '#anchor' is no heading of it."""
    broken = []
    for page in pages:
        for number, line in prose_lines(page.read_text(encoding="utf-8")):
            for match in LINK.finditer(line):
                target = match.group(1)
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                path, _, fragment = target.partition("#")
                full = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(root)}:{number}: {target}"
                if not full.exists():
                    broken.append(f"{where}: no such file")
                elif fragment and full.suffix == ".md" and fragment not in anchors(full):
                    broken.append(f"{where}: no such heading")
    return broken


def test_every_relative_link_of_the_docs_has_its_target():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert broken_links(pages, REPO) == []


def test_a_missing_file_or_heading_is_named(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n## `-t < -n`: where a round's time goes\n\n### Twice\n\n### Twice\n\n"
        "[ok](#-t---n-where-a-rounds-time-goes), [ok](#twice-1), [ok](page.md#a-page), `[code](gone.md)`\n"
        "[gone](gone.md), [no heading](page.md#twice-2)\n",
        encoding="utf-8",
    )
    assert anchors(page) == {"a-page", "-t---n-where-a-rounds-time-goes", "twice", "twice-1"}
    assert broken_links([page], tmp_path) == [
        "page.md:10: gone.md: no such file",
        "page.md:10: page.md#twice-2: no such heading",
    ]


def test_the_client_api_pages_diff_is_the_examples_own():
    """docs/client_api.md's "From the plain script to MOON" diff: every hunk's old side is client.py's lines at the
    hunk's place and its new side client_moon.py's, so an edit of either script that the page misses fails here."""
    page = (REPO / "docs" / "client_api.md").read_text(encoding="utf-8")
    diff = re.search(r"### From the plain script to MOON\n\n```diff\n(.*?)```", page, re.S).group(1)
    examples = REPO / "docs" / "examples" / "client_api"
    plain = (examples / "client.py").read_text(encoding="utf-8").split("\n")
    moon = (examples / "client_moon.py").read_text(encoding="utf-8").split("\n")
    hunks = re.split(r"(?m)^(?=@@ )", diff)[1:]
    assert hunks
    for hunk in hunks:
        header, *body = hunk.rstrip("\n").split("\n")
        old_start, new_start = (int(n) - 1 for n in re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", header).groups())
        old = [line[1:] for line in body if line[:1] in " -"]
        new = [line[1:] for line in body if line[:1] in " +"]
        assert plain[old_start : old_start + len(old)] == old, f"{header}: client.py differs; rerun diff -u"
        assert moon[new_start : new_start + len(new)] == new, f"{header}: client_moon.py differs; rerun diff -u"
