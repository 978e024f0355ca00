"""The README stays a front page and every page in docs/ is in the site's navigation (issue 37
item 3). Cheap: reads files only; the strict site build itself is scripts/docs.sh, in .ci/run."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
README_MAX_LINES = 300


def nav_pages(mkdocs_yml):
    """The .md paths of mkdocs.yml's nav section (one `- Title: page.md` line per page)."""
    pages, in_nav = [], False
    for line in mkdocs_yml.splitlines():
        if re.match(r"^\S", line):
            in_nav = line.startswith("nav:")
            continue
        match = re.match(r"^\s*-\s*(?:[^:]+:\s*)?(\S+\.md)\s*$", line)
        if in_nav and match:
            pages.append(match.group(1))
    return pages


def doc_pages():
    return sorted(os.path.relpath(os.path.join(folder, name), DOCS).replace(os.sep, "/")
                  for folder, _dirs, names in os.walk(DOCS) for name in names if name.endswith(".md"))


def test_readme_is_a_front_page():
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail into a page of docs/")


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        listed = nav_pages(f.read())
    pages = doc_pages()
    assert "index.md" in pages
    duplicates = sorted({p for p in listed if listed.count(p) > 1})
    assert not duplicates, f"listed twice in mkdocs.yml's nav: {duplicates}"
    assert sorted(set(pages) - set(listed)) == [], "pages in docs/ missing from mkdocs.yml's nav"
    assert sorted(set(listed) - set(pages)) == [], "mkdocs.yml's nav lists pages that docs/ lacks"


def test_nav_reader_sees_pages_nested_or_not():
    text = "site_name: x\nnav:\n  - Home: index.md\n  - A section:\n      - Deep: a/b.md\n  - plain.md\nplugins:\n  - x.md\n"
    assert nav_pages(text) == ["index.md", "a/b.md", "plain.md"]


def reference_members(text, module):
    """The `members:` list under `::: module` in an API reference page."""
    lines = text.splitlines()
    start = lines.index(f"::: {module}")
    members = []
    for line in lines[start + 1:]:
        if line.startswith("::: ") or (line and not line.startswith(" ")):
            break
        match = re.match(r"^\s+- (\w+)$", line)
        if match:
            members.append(match.group(1))
    return members


def test_the_api_reference_lists_every_public_name_of_collectives():
    # The reference page names collectives' members: griffe reads the sources without importing
    # them, so it cannot see the verbs made at import, and an imported name is private to it.
    # Read in a fresh interpreter: once a test has imported the submodule collectives.run (the
    # launcher's `python -m collectives.run`), Python binds it over the function collectives.run.
    import json
    import subprocess
    import sys

    from collectives.dispatch import VERBS

    with open(os.path.join(DOCS, "reference", "collectives.md")) as f:
        text = f.read()
    listing = ("import collectives, json, types; print(json.dumps(sorted(n for n, v in vars(collectives).items() "
               "if not n.startswith('_') and not isinstance(v, types.ModuleType))))")
    public = set(json.loads(subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True,
                                           check=True, timeout=120).stdout))
    assert sorted(reference_members(text, "collectives.ops")) == sorted(VERBS)
    assert sorted(reference_members(text, "collectives")) == sorted(public - set(VERBS)), (
        "docs/reference/collectives.md: the `::: collectives` members differ from the package's public names")
