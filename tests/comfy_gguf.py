"""ComfyUI-GGUF's own dequantisation, imported from the unmodified snapshot (../shared/ComfyUI-GGUF) as an oracle.

Its ``dequant.py`` needs only torch, gguf and tqdm. The snapshot is found like ComfyUI's (tests/comfyui/
comfy_env.py): $DIT_PARALLEL_COMFYUI_GGUF, else ``shared/ComfyUI-GGUF`` beside the repository or a folder
above it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT_ENV = "DIT_PARALLEL_COMFYUI_GGUF"


def snapshot_dir() -> Path:
    env = os.environ.get(SNAPSHOT_ENV)
    if env:
        return Path(env).resolve()
    for parent in REPO.parents:
        candidate = parent / "shared" / "ComfyUI-GGUF"
        if (candidate / "dequant.py").is_file():
            return candidate
    return REPO.parent / "shared" / "ComfyUI-GGUF"


@functools.cache
def comfy_dequant() -> ModuleType:
    """ComfyUI-GGUF's dequant.py as a module (a test failure naming the fix when the snapshot is missing)."""
    path = snapshot_dir() / "dequant.py"
    if not path.is_file():
        pytest.fail(
            f"ComfyUI-GGUF is missing at {path.parent} (CI keeps it at ../shared/ComfyUI-GGUF next to the "
            f"repository); set ${SNAPSHOT_ENV} to a checkout of city96/ComfyUI-GGUF"
        )
    spec = importlib.util.spec_from_file_location("comfy_gguf_dequant", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def comfy_dequantise(
    raw: torch.Tensor, type_name: str, shape: tuple[int, ...], dtype: torch.dtype, dequant_dtype: str = "default"
) -> torch.Tensor:
    """What ComfyUI-GGUF's ``dequantize_tensor`` gives for the stored bytes ``raw`` (its layer's call with the
    compute dtype ``dtype`` and UnetLoaderGGUFAdvanced's ``dequant_dtype`` choice)."""
    import gguf

    module = comfy_dequant()
    mode = {"default": None, "target": "target"}.get(dequant_dtype, getattr(torch, dequant_dtype, None))
    tensor = raw.clone()
    tensor.tensor_type = gguf.GGMLQuantizationType[type_name]
    tensor.tensor_shape = torch.Size(shape)
    return module.dequantize_tensor(tensor, dtype, mode)


def comfy_reference_file(path: Path, out: Path, dtype: torch.dtype, mode: str = "default") -> Path:
    """Every tensor of the GGUF ``path`` as ComfyUI-GGUF dequantises it for compute dtype ``dtype``, saved as
    float32 .safetensors (F32 / F16 tensors as ComfyUI-GGUF casts them)."""
    import gguf
    from safetensors.torch import save_file

    reader = gguf.GGUFReader(path)
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        raw = torch.from_numpy(t.data.copy())
        tensors[t.name] = comfy_dequantise(raw, t.tensor_type.name, shape, dtype, mode).to(torch.float32).contiguous()
    save_file(tensors, str(out))
    return out
