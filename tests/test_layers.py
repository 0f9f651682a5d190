"""The layers of the tree, read from the source (ast, nothing imported).

``runtime`` (the configuration) is below everything: it imports no other
package of the project, and the site and every app may import it. ``aitp``
is the ground floor of the apps: it imports none of the apps built on it
(what a turn needs from them is declared in ``aitp.ports``). The engines
(``llm``: the model's backends; ``speech``: the speech engines, their worker
pool and the pieces of a voice turn) stand on it and below the agent and the
connection: they import only the protocol app and the low layers. No two apps
depend on each other, and no module imports another that imports it back --
not even through an import inside a function.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The engines: the interfaces they implement are the protocol app's (aitp.llm,
# aitp.voice), the engines themselves are not.
ENGINES = {"llm", "speech"}
APPS_ABOVE_AITP = {"approvals", "console", "operators", "demo", "connection", "agent", *ENGINES}
# Imported by the site and the apps; imports none of them.
LOW_LAYERS = {"runtime"}


def packages() -> list[str]:
    return sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(f): f for package in packages() for f in (ROOT / package).rglob("*.py")}


def imported_names(name: str, path: Path, *, top_level_only: bool) -> set[str]:
    """Every module name an ``import`` in this file may refer to (``from a
    import b`` counts as both ``a`` and ``a.b``); with ``top_level_only``,
    only the imports that run when the module is imported."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = _import_time_nodes(tree) if top_level_only else ast.walk(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _import_time_nodes(tree: ast.Module):
    """Statements that run at import: the module body and class bodies, and
    the branches of top-level if/try -- never function bodies, and never
    ``if TYPE_CHECKING:`` blocks."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                stack.extend(handler.body)


def import_graph(*, top_level_only: bool) -> dict[str, set[str]]:
    """Module -> the project's modules it imports. A module's own packages
    are left out: Python runs a package before any module inside it, so
    ``from . import sibling`` is an edge to the sibling, not to the package."""
    known = modules()
    graph = {}
    for name, path in known.items():
        own_packages = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}
        imported = imported_names(name, path, top_level_only=top_level_only)
        graph[name] = {
            m for m in imported
            if m in known and m != name and m not in own_packages
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def app_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, imports in import_graph(top_level_only=False).items():
        app = name.split(".")[0]
        graph.setdefault(app, set()).update(m.split(".")[0] for m in imports if m.split(".")[0] != app)
    return graph


def test_the_protocol_app_imports_none_of_the_apps_built_on_it():
    offending = sorted(
        f"{name} imports {imported}"
        for name, imports in import_graph(top_level_only=False).items()
        if name.split(".")[0] == "aitp"
        for imported in imports
        if imported.split(".")[0] in APPS_ABOVE_AITP
    )
    assert offending == []


def test_the_low_layers_import_no_other_package_of_the_project():
    offending = sorted(
        f"{name} imports {imported}"
        for name, imports in import_graph(top_level_only=False).items()
        if name.split(".")[0] in LOW_LAYERS
        for imported in imports
        if imported.split(".")[0] != name.split(".")[0]
    )
    assert offending == []


def test_the_engines_import_only_the_protocol_app_and_the_low_layers():
    offending = sorted(
        f"{name} imports {imported}"
        for name, imports in import_graph(top_level_only=False).items()
        if name.split(".")[0] in ENGINES
        for imported in imports
        if imported.split(".")[0] not in {name.split(".")[0], "aitp", *LOW_LAYERS}
    )
    assert offending == []


def test_no_two_apps_depend_on_each_other():
    assert cycles(app_graph()) == []


def test_no_module_imports_one_that_imports_it_back_at_import_time():
    assert cycles(import_graph(top_level_only=True)) == []


def test_no_module_imports_one_that_imports_it_back_even_inside_a_function():
    # A function-local import hides a cycle from the interpreter, not from
    # the reader: it is still two modules that need each other.
    assert cycles(import_graph(top_level_only=False)) == []


def test_the_checks_see_a_cycle_and_an_upward_import_when_there_is_one():
    # The walk itself: a cycle is found, and the real tree has the edges it claims.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = app_graph()
    assert "aitp" in graph["approvals"] and "approvals" in graph["operators"]
    assert "runtime" in graph["aitp"] and "runtime" in graph["owllayer_site"]
    assert "aitp" in graph["connection"] and "connection" in graph["owllayer_site"]
    assert "aitp" in graph["agent"] and "agent" in graph["connection"]
    assert "aitp" in graph["llm"] and "llm" in graph["connection"] and "llm" in graph["owllayer_site"]
    assert "aitp" in graph["speech"] and "speech" in graph["agent"] and "speech" in graph["connection"]
    assert not graph.get("aitp", set()) & APPS_ABOVE_AITP
