"""No import cycles between moerag's modules, deferred imports (inside functions) and imports
under `if TYPE_CHECKING:` included: a cycle hidden in a function or behind the type checker is
still two modules that cannot be understood one without the other (a module that needs a few
parts of another's class names them in a Protocol of its own)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "index", "kernels", "benchmarks", "migrations")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The moerag modules `path` imports (a `from package import name` of a submodule counts it)."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != me}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_round_a_cycle() -> None:
    files = [f for p in PACKAGES for f in (ROOT / p).rglob("*.py")]
    known = {module_name(f) for f in files}
    # A package's __init__ re-exporting its submodules is the package's face, not a cycle.
    graph = {module_name(f): imports(f, known) for f in files}
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    assert cycles(graph) == []
