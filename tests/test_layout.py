"""The package's import graph has no circle: each module can be read, and imported, after the ones it uses."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nvflare_moon"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict:
    """module -> the package's modules it imports, at the top or inside a function (a package importing its own
    submodules, to re-export them, is not an edge)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + [node.module or ""]).strip(".")
                else:
                    base = node.module
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name and not t.startswith(name + ".")}
        graph[name] = edges
    return graph


def circles(graph: dict) -> list:
    """The graph's strongly connected components of more than one module (Tarjan)."""
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


def test_the_finder_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert "nvflare_moon.ops.continuation" in graph["nvflare_moon.ops.resume_point"]  # the graph is read
    assert circles(graph) == []


# layer -> the layers it may import (see docs/contributing.md): the framework-free core under everything, the server
# never on the site side, and nothing in the product on the evidence (the benchmark, SOLO)
FOUNDATION = {"core", "data", "models"}
MAY_IMPORT = {
    "core": FOUNDATION,
    "data": FOUNDATION,
    "models": FOUNDATION,
    "client": FOUNDATION,
    "executors": FOUNDATION,
    "server": FOUNDATION,
    "filters": FOUNDATION,
    "sim": FOUNDATION,
    "recipes": FOUNDATION | {"executors", "server", "filters", "sim", "ops"},
    "methods": FOUNDATION | {"client", "executors", "recipes"},
    "ops": FOUNDATION | {"recipes", "server", "sim", "methods"},
}


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else "root"


def layer_violations(graph: dict) -> list:
    """``(importer, imported)`` pairs that cross the layers against :data:`MAY_IMPORT`."""
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if _layer(module) in MAY_IMPORT
        and _layer(target) != _layer(module)
        and _layer(target) not in MAY_IMPORT[_layer(module)]
    )


def test_the_layer_check_sees_a_server_module_importing_the_site_side():
    graph = {"nvflare_moon.server.a": {"nvflare_moon.client.b", "nvflare_moon.core.c"}, "nvflare_moon.core.c": set()}
    assert layer_violations(graph) == [("nvflare_moon.server.a", "nvflare_moon.client.b")]


def test_each_layer_imports_only_the_layers_below_it():
    graph = import_graph()
    assert {_layer(m) for m in graph} - {"root"} <= set(MAY_IMPORT) | {"benchmark", "solo"}  # every folder is ruled
    assert layer_violations(graph) == []
