"""diffusers internals we depend on are still where models/compat.py expects them.

When a diffusers upgrade moves or removes one, this fails naming it, its old place, what it is used
for and the installed version, instead of a confusing error deep inside loading or sampling.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from parallel_runtime.models import compat

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "module, name, use", compat.DIFFUSERS_INTERNALS, ids=[n for _, n, _ in compat.DIFFUSERS_INTERNALS]
)
def test_diffusers_internal_is_where_compat_expects_it(module, name, use):
    import diffusers

    where = f"{module}.{name} (used for {use})"
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError as exc:
        pytest.fail(
            f"diffusers {diffusers.__version__} has no module {module} ({exc}): {where} moved; update models/compat.py"
        )
    assert found is not None, f"diffusers {diffusers.__version__} moved or removed {where}; update models/compat.py"


def test_processor_attributes_and_native_backend():
    import diffusers
    from diffusers.models.attention_dispatch import AttentionBackendName
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    version = diffusers.__version__
    processor = FluxAttnProcessor()
    for attribute in ("_attention_backend", "_parallel_config"):
        assert hasattr(processor, attribute), (
            f"diffusers {version}: FluxAttnProcessor lost {attribute}; update compat.py"
        )
    assert AttentionBackendName.NATIVE.value == compat.NATIVE_BACKEND, f"diffusers {version} renamed the native backend"
    assert compat.attention_backend(processor) == compat.NATIVE_BACKEND  # nothing set: the default backend
    assert not compat.uses_context_parallel(processor)


def test_only_compat_imports_diffusers_internals():
    """Source outside models/compat.py imports diffusers only from its public top level."""
    offenders = []
    for path in sorted((ROOT / "parallel_runtime").rglob("*.py")):
        if path.name == "compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("diffusers.")]
    assert not offenders, "import diffusers internals through parallel_runtime.models.compat: " + ", ".join(offenders)
