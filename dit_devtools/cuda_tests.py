"""The CUDA-marked tests on a GPU image without pytest: ``python -m dit_devtools.cuda_tests tests/test_gpu_cuda.py``.

``dit_devtools/gpu_check.sh`` runs the tests with pytest when the machine has it (or its wheel came along);
a bare image may have neither, and the check must still run the GPU numerics. This stand-in gives each test
module a minimal ``pytest`` (marks, ``skipif``, ``parametrize``, ``raises``), runs every test function that
takes no fixture once per parametrize case, and prints a line per test and a summary. Exit code 1 when a test
failed, 0 otherwise (skips included). Nothing here is used when pytest is installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class Skipped(Exception):
    """A test skipped itself (``pytest.skip``) or a ``skipif`` mark holds."""


class _Mark:
    """``pytest.mark.NAME(...)``: a decorator keeping what the runner needs (parametrize cases, skip reasons)."""

    def __init__(self, name: str, args: tuple = (), kwargs: dict | None = None):
        self.name, self.args, self.kwargs = name, args, kwargs or {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        configured = bool(self.args or self.kwargs)
        if configured or (len(args) == 1 and callable(args[0]) and not kwargs):  # applied to a test function
            args[0].__dict__.setdefault("marks", []).append(self)
            return args[0]
        return _Mark(self.name, args, kwargs)  # pytest.mark.skipif(...), pytest.mark.parametrize(...)


class _Marks:
    def __getattr__(self, name: str) -> _Mark:
        return _Mark(name)


@contextlib.contextmanager
def _raises(kind: type[BaseException], match: str | None = None) -> Iterator[None]:
    try:
        yield
    except kind as exc:
        assert match is None or re.search(match, str(exc)), f"{exc!r} does not match {match!r}"
        return
    raise AssertionError(f"did not raise {kind.__name__}")


def _skip(reason: str = "") -> None:
    raise Skipped(reason)


def stand_in() -> types.ModuleType:
    """A ``pytest`` module with what the CUDA test modules use."""
    module = types.ModuleType("pytest")
    module.mark = _Marks()  # type: ignore[attr-defined]
    module.raises = _raises  # type: ignore[attr-defined]
    module.skip = _skip  # type: ignore[attr-defined]
    return module


def _cases(func: Callable) -> list[tuple[str, dict[str, Any]]]:
    cases: list[tuple[str, dict[str, Any]]] = [("", {})]
    for mark in func.__dict__.get("marks", []):
        if mark.name != "parametrize":
            continue
        names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else mark.args[0]
        grown = []
        for suffix, kwargs in cases:
            for value in mark.args[1]:
                values = value if len(names) > 1 else (value,)
                label = "-".join(str(v) for v in values)
                grown.append((f"{suffix}-{label}" if suffix else label, {**kwargs, **dict(zip(names, values))}))
        cases = grown
    return cases


def _skip_reason(marks: list[_Mark]) -> str | None:
    for mark in marks:
        if mark.name == "skipif" and mark.args and mark.args[0]:
            return str(mark.kwargs.get("reason", "skipif"))
    return None


def run_file(path: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) of the test functions in ``path`` that take no fixture."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module_marks = getattr(module, "pytestmark", [])
    module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
    counts = [0, 0, 0]
    for name, func in vars(module).items():
        if not (name.startswith("test_") and callable(func)):
            continue
        for label, kwargs in _cases(func):
            test = f"{path.name}::{name}{f'[{label}]' if label else ''}"
            reason = _skip_reason(module_marks + func.__dict__.get("marks", []))
            needs = set(func.__code__.co_varnames[: func.__code__.co_argcount]) - set(kwargs)
            if reason is None and needs:
                reason = f"needs pytest fixtures {sorted(needs)}"
            if reason is not None:
                print(f"SKIPPED {test}: {reason}")
                counts[2] += 1
                continue
            try:
                func(**kwargs)
            except Skipped as exc:
                print(f"SKIPPED {test}: {exc}")
                counts[2] += 1
            except Exception:  # noqa: BLE001 - reported, the next test runs
                print(f"FAILED {test}\n{traceback.format_exc()}")
                counts[1] += 1
            else:
                print(f"PASSED {test}")
                counts[0] += 1
    return counts[0], counts[1], counts[2]


def main(argv: list[str] | None = None) -> int:
    files = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    sys.modules.setdefault("pytest", stand_in())
    totals = [0, 0, 0]
    for path in files:
        for i, n in enumerate(run_file(path)):
            totals[i] += n
    print(f"== {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped (dit_devtools.cuda_tests, no pytest)")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    raise SystemExit(main())
