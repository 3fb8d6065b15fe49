"""The engine's wings import only downwards and never each other's private names.

Layering, lowest first (a wing may import from the wings below it and from the shared top-level
modules ``errors`` and ``exports``):
errors < parallel < runtime < attention < models < sampling < denoise < pipefusion < vae < service < tools.
``sampling`` is pure math: it imports nothing of the engine but the shared modules, and no torch.distributed.
The engine never imports the checkout's ``dit_devtools`` (nor the tests) by name: only through
``parallel_runtime.checkout``, which says what to do when an installed package has no checkout beside it.
No import circles in the engine or the dev tools.
The node layer (``nodes/``) is a thin face over the service: of the engine it imports only ``service`` and the
shared ``errors`` (issue 23), and it names no private module or name there either.
Imports inside functions count too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "parallel_runtime"
WINGS = ("parallel", "runtime", "attention", "models", "sampling", "denoise", "pipefusion", "vae", "service", "tools")
SHARED = ("errors", "exports", "checkout")  # top-level modules every wing may use
ENTRY = ("__main__",)  # python -m parallel_runtime: may import the tools wing


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(absolute module, imported name or None, line) of every import in ``path``."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out += [(target, a.name, node.lineno) for a in node.names]
    return out


def _wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "parallel_runtime" else None


SOURCES = sorted(PACKAGE.rglob("*.py"))
NODE_SOURCES = sorted((ROOT / "nodes").rglob("*.py"))
NODES_MAY_IMPORT = ("service", "errors")  # the engine wings (and shared modules) the node layer reaches


def test_every_module_belongs_to_a_wing_or_is_shared():
    stray = [p.relative_to(ROOT) for p in SOURCES if _wing_of(_module_name(p)) not in (*WINGS, *SHARED, *ENTRY, None)]
    assert not stray, f"modules outside the wings {WINGS}: {stray}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_the_layers_and_skip_private_names(path):
    own = _wing_of(_module_name(path))
    problems = []
    for target, name, line in _imports(path):
        wing = _wing_of(target)
        if target == "parallel_runtime" and name in WINGS:  # from parallel_runtime import <wing>
            wing, name = name, None
        if wing is None or wing == own:
            continue
        where = f"{path.relative_to(ROOT)}:{line} imports {target}{'.' + name if name else ''}"
        if own in ENTRY or wing in SHARED:
            pass
        elif own in SHARED or own is None:
            problems.append(f"{where}: shared top-level modules import no wing")
        elif wing in WINGS and WINGS.index(wing) > WINGS.index(own):
            problems.append(f"{where}: {own} sits below {wing} and must not import it")
        private = [p for p in (*target.split(".")[2:], name or "") if p.startswith("_") and not p.startswith("__")]
        if private and own not in ENTRY:
            problems.append(f"{where}: {', '.join(private)} is private to the {wing} wing")
    assert not problems, "\n".join(problems)


def _node_problems(label: str, imports: list[tuple[str, str | None, int]]) -> list[str]:
    problems = []
    for target, name, line in imports:
        if target == "parallel_runtime" and name is not None:  # from parallel_runtime import <wing>
            target, name = f"parallel_runtime.{name}", None
        if target.split(".")[0] != "parallel_runtime":
            continue
        where = f"{label}:{line} imports {target}{'.' + name if name else ''}"
        wing = _wing_of(target)
        if wing not in NODES_MAY_IMPORT:
            problems.append(f"{where}: the nodes reach the engine only through {NODES_MAY_IMPORT}")
        private = [p for p in (*target.split(".")[2:], name or "") if p.startswith("_") and not p.startswith("__")]
        if private:
            problems.append(f"{where}: {', '.join(private)} is private to the {wing} wing")
    return problems


@pytest.mark.parametrize("path", NODE_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nodes_import_only_the_service_and_errors(path):
    problems = _node_problems(str(path.relative_to(ROOT)), _imports(path))
    assert not problems, "\n".join(problems)


def test_the_node_check_finds_an_engine_import():
    """The check above is not vacuous: a node reaching a wing below the service directly is caught."""
    imports = [
        ("parallel_runtime.parallel.config", "validate_layout", 1),  # what nodes/loader.py imported
        ("parallel_runtime", "runtime", 2),
        ("parallel_runtime.service.api", "LoadRequest", 3),
        ("parallel_runtime.service._x", "y", 4),
        ("parallel_runtime.errors", "ConfigError", 5),
    ]
    problems = _node_problems("probe.py", imports)
    assert len(problems) == 3 and "parallel_runtime.parallel.config" in problems[0] and "_x" in problems[2]


def test_sampling_is_pure_math():
    problems = []
    for path in sorted((PACKAGE / "sampling").rglob("*.py")):
        for target, _, line in _imports(path):
            engine = _wing_of(target) not in (None, "sampling", *SHARED)
            if engine or target.startswith("torch.distributed"):
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not problems, "sampling imports only errors, torch (no torch.distributed), scipy, torchsde:\n" + "\n".join(
        problems
    )


def test_the_engine_names_no_dev_tools_or_tests():
    problems = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in SOURCES
        for target, _, line in _imports(path)
        if target.split(".")[0] in ("dit_devtools", "tests")
    ]
    assert not problems, "reach dit_devtools through parallel_runtime.checkout.devtools_module:\n" + "\n".join(problems)


# Circles other work is removing; a new circle anywhere else fails.
KNOWN_CIRCLES: tuple[set[str], ...] = ()


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules of the engine and the dev tools it imports (a package's ``from . import x``
    counts as importing ``x``)."""
    paths = {_module_name(p): p for p in (*SOURCES, *sorted((ROOT / "dit_devtools").rglob("*.py")))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        found = set()
        for target, name, _ in _imports(path):
            target = f"{target}.{name}" if f"{target}.{name}" in paths else target
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):  # not its own package
                found.add(target)
        graph[module] = found
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(component)
    return circles


def test_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    known = [{f"parallel_runtime.{m}" for m in circle} for circle in KNOWN_CIRCLES]
    new = [sorted(c) for c in _circles(_import_graph()) if c not in known]
    assert not new, f"modules importing each other (split out what both need): {new}"
