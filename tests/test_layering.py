"""The engine's wings import only downwards and never each other's private names.

Layering, lowest first (a wing may import from the wings below it and from the shared top-level
modules ``errors`` and ``exports``):
errors < parallel < runtime < attention < models < sampling < denoise < pipefusion < vae < service < tools.
``sampling`` is pure math: it imports nothing of the engine but the shared modules, and no torch.distributed.
Imports inside functions count too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "parallel_runtime"
WINGS = ("parallel", "runtime", "attention", "models", "sampling", "denoise", "pipefusion", "vae", "service", "tools")
SHARED = ("errors", "exports")  # top-level modules every wing may use
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


def _import_cycles(wing: str) -> list[list[str]]:
    """Groups of ``wing``'s modules that import each other in a circle (TYPE_CHECKING imports count)."""
    modules = {_module_name(p): p for p in SOURCES if _wing_of(_module_name(p)) == wing}
    graph = {}
    for module, path in modules.items():
        targets = {f"{t}.{n}" if f"{t}.{n}" in modules else t for t, n, _ in _imports(path)}
        graph[module] = sorted(t for t in targets if t in modules and t != module)
    reach = {m: set() for m in graph}
    for start in graph:  # small wings: a walk from every module is enough
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            if m not in reach[start]:
                reach[start].add(m)
                todo += graph[m]
    groups = {frozenset({m} | {o for o in reach[m] if m in reach[o]}) for m in graph if m in reach[m]}
    return sorted(sorted(g) for g in groups)


def test_the_runtime_wing_has_no_import_cycle():
    assert _import_cycles("runtime") == []
