"""Dependencies point one way: app -> engine -> index, kernels."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "engine": {"app", "fastapi", "sqlalchemy", "starlette", "uvicorn", "alembic"},
    "index": {"app", "engine", "kernels", "fastapi", "sqlalchemy"},
    "kernels": {"app", "engine", "index", "fastapi", "sqlalchemy"},
    "moerag": {"app", "engine", "index", "kernels", "fastapi", "sqlalchemy", "torch"},  # the client stands alone
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package: str) -> None:
    files = list((ROOT / package).rglob("*.py"))
    assert files
    for f in files:
        bad = imported_roots(f) & FORBIDDEN[package]
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}"


def test_routes_hold_no_sql() -> None:
    """Routes map request and response bodies; every read and write of the catalogue is a service's."""
    files = list((ROOT / "app" / "api" / "routes").rglob("*.py"))
    assert files
    for f in files:
        assert "sqlalchemy" not in imported_roots(f), f"{f.relative_to(ROOT)} imports sqlalchemy"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                inner = node.func.value
                opens = isinstance(inner, ast.Attribute) and inner.attr == "sessions" and node.func.attr == "begin"
                assert not opens, f"{f.relative_to(ROOT)}:{node.lineno} opens a transaction"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sessions":
                raise AssertionError(f"{f.relative_to(ROOT)}:{node.lineno} opens a session")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports by absolute name, at any depth (inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_app_factory_imports_routes() -> None:
    """The CLI and the services call services; route modules are mounted by `app.api.main` alone."""
    for f in (ROOT / "app").rglob("*.py"):
        if f.parent == ROOT / "app" / "api" / "routes" or f == ROOT / "app" / "api" / "main.py":
            continue
        routes = {m for m in imported_modules(f) if m == "app.api.routes" or m.startswith("app.api.routes.")}
        assert not routes, f"{f.relative_to(ROOT)} imports {sorted(routes)}"


def test_every_error_code_has_one_status() -> None:
    """Each code an engine or service error carries is mapped to an HTTP status in app.core.errors."""
    import engine.errors as errors
    from app.core.errors import STATUS

    codes = {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.MoeragError) and cls is not errors.MoeragError
    }
    assert codes and codes <= set(STATUS), sorted(codes - set(STATUS))


def test_the_client_reads_the_same_file_types_as_the_server() -> None:
    """moerag.client keeps its own copy of the folder walk's types (it imports nothing of the server)."""
    from engine.parsing import SUFFIXES
    from moerag import client

    assert client.SUFFIXES == SUFFIXES
    console = (ROOT / "app" / "console" / "static" / "console.js").read_text()  # the console's folder upload
    listed = console.split("const SUPPORTED = [", 1)[1].split("]", 1)[0]
    assert {s.strip().strip('"') for s in listed.split(",")} == SUFFIXES


# The folders of app/, bottom to top: a module imports from its own folder and the ones below it.
APP_LAYERS = ("core", "store", "schemas", "clustering", "serving", "services", "shards", "runtime", "api", "cli")


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "app" and parts[1] in APP_LAYERS else None


def test_app_s_folders_import_downwards_only() -> None:
    """`app/` holds runtime.py (the composition root) and folders named for what they own; the
    import arrows between them point one way. Only the HTTP service and the CLI, which build or
    receive the composition root, import `app.runtime`."""
    files = sorted((ROOT / "app").rglob("*.py"))
    assert {f.name for f in (ROOT / "app").glob("*.py")} == {"__init__.py", "runtime.py"}
    for f in files:
        rel = f.relative_to(ROOT / "app")
        mine = "runtime" if rel.name == "runtime.py" and len(rel.parts) == 1 else rel.parts[0]
        if mine not in APP_LAYERS:
            continue
        for module in imported_modules(f):
            theirs = _layer(module)
            if theirs is not None:
                assert APP_LAYERS.index(theirs) <= APP_LAYERS.index(mine), f"app/{rel} imports {module}"


def test_services_raise_domain_errors() -> None:
    """Below the API, errors are engine.errors' domain errors with codes; the API maps them to HTTP
    (app.core.errors.STATUS), so a service never raises the HTTP layer's ApiError."""
    for layer in ("store", "clustering", "serving", "services"):
        for f in (ROOT / "app" / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.ImportFrom) and node.module == "app.core.errors":
                    names = {a.name for a in node.names}
                    assert "ApiError" not in names, f"{f.relative_to(ROOT)} imports ApiError"
