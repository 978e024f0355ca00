"""No import cycles among the project's modules (the style rule: layers call downward only).

Every import statement counts, also those inside functions: a lazy import hides a cycle from
Python's loader but not from a reader, and it is how the old basics/process_sets/ops cycle lived.
The check reads the sources with ``ast``; it imports nothing.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("collectives", "adapters")


def _modules():
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    if name.endswith(".__init__"):
                        name = name[: -len(".__init__")]
                    found[name] = path
    return found


def _imports(name, path, modules):
    """The project modules ``name`` imports (a package counts only when nothing in it is named)."""
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rsplit(".", 1)[0]
                base = anchor + ("." + node.module if node.module else "")
            named = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
            targets.update(named or ([base] if node.module else []))
    # collectives.adapters is the adapters package under another name (see collectives/__init__.py)
    targets = {t.replace("collectives.adapters", "adapters", 1) if t.startswith("collectives.adapters") else t
               for t in targets}
    return {t for t in targets if t in modules and t != name}


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    described = ["; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_the_checker_sees_a_lazy_cycle(tmp_path):
    # The check must be able to fail: two modules that import each other inside functions.
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b"]]
