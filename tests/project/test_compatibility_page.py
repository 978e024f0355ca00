"""docs/compatibility.md, the framework matrix's page (scripts/framework_matrix.sh, too heavy for
CI, writes it): it has the date of its run, every cell of scripts/framework_matrix.py's CELLS has a
result on it, and pyproject.toml's optional extras state the range the page states. The last test
proves the check can fail: a page with a cell not run, no date, or extras that disagree is reported.
"""
import importlib.util
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
RESULT = re.compile(r"^(pass|\*\*fail\*\*: first failure: \S+|\*\*fail\*\*: .+|not served: .+|skipped: .+)")


def load(name):
    sys.path.insert(0, SCRIPTS)  # framework_matrix imports compatibility_page from beside it
    try:
        spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(SCRIPTS)


def extras(pyproject):
    """pyproject.toml's [project.optional-dependencies] as {name: [requirement, ...]}."""
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return {m.group(1): re.findall(r'"([^"]+)"', m.group(2))
            for m in re.finditer(r"^(\w[\w-]*)\s*=\s*\[(.*)\]", section, re.M)}


def problems(page, pyproject, cells, supported):
    """What is wrong with the page and the extras; [] when nothing."""
    found = []
    if not re.search(r"^Run on \d{4}-\d{2}-\d{2}", page, re.M):
        found.append("the page has no date of its run")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in page.splitlines() if line.startswith("| ") and not line.startswith("| cell ")}
    for cell in cells:
        row = rows.get(cell.name)
        if row is None:
            found.append(f"cell {cell.name} is not on the page")
        elif not RESULT.match(row[7]):
            found.append(f"cell {cell.name} has no result: {row[7]!r}")
    declared = extras(pyproject)
    for name, requirement in supported.items():
        if declared.get(name) != [requirement]:
            found.append(f"pyproject.toml's extra {name} is {declared.get(name)}, the page says {requirement}")
        if f'`{name} = ["{requirement}"]`' not in page:
            found.append(f"the page does not state {name} = {requirement}")
    return found


def current():
    with open(os.path.join(ROOT, "docs", "compatibility.md")) as f:
        page = f.read()
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pyproject = f.read()
    return page, pyproject, load("framework_matrix").CELLS, load("compatibility_page").SUPPORTED


def test_the_page_has_its_date_every_cell_and_the_extras_range():
    assert problems(*current()) == []


def test_the_check_reports_a_cell_not_run_no_date_and_other_extras():
    page, pyproject, cells, supported = current()
    first = cells[0].name
    broken = re.sub(r"^Run on \d{4}-\d{2}-\d{2}", "Run on (not yet run)", page, flags=re.M)
    broken = re.sub(rf"^(\| {re.escape(first)} (?:\|[^|]*){{6}})\|[^|]*\|", r"\1| not run yet |", broken, flags=re.M)
    found = problems(broken, pyproject.replace('"torch>=2.4"', '"torch>=2.0"'), cells, supported)
    assert found == ["the page has no date of its run", f"cell {first} has no result: 'not run yet'",
                     "pyproject.toml's extra torch is ['torch>=2.0'], the page says torch>=2.4"], found
