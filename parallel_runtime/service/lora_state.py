"""LoRA on the workers: each rank keeps its loaded model's weights at the stack the current job asks for.

The patcher belongs to the loaded model (``LoadedModel.lora``): a model loaded anew starts pristine.
``generate`` brings the transformer to the job's stack (strength_model), ``encode_text`` the text encoders
(strength_clip, on the rank that holds them). Every rank patches only what it holds; USP / CFG replicas
compute the same patches with the same operations, so they stay identical. A two-expert model (Wan 2.2 A14B
from a diffusers folder) patches both experts with the stack, as ComfyUI does when the same LoRA loader
feeds each expert's model (each expert has its own patcher and pristine weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..models.lora.keymap import TRANSFORMER, ModelKeys
from ..models.lora.model_keys import model_keys
from ..models.lora.patcher import LoraPatcher, StackEntry


def original_layout(components: Any) -> dict[str, tuple[int, ...]] | None:
    """The original-layout tensors of a single-file model, from its header (None for a folder: the
    key table then computes them from the config)."""
    path = Path(components.path)
    if path.is_file() and path.name.lower().endswith(".gguf"):
        from ..models.gguf.model_file import transformer_shapes
        from ..models.gguf.reader import GGUFFile

        return transformer_shapes(GGUFFile(path))
    if not path.is_file() or not path.name.endswith((".safetensors", ".sft")):
        return None
    return file_layout(path)


def file_layout(path: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the transformer tensors a single file stores (fp8 scales and markers left out)."""
    from ..models.files import read_safetensors_header
    from ..models.fp8 import detect_quantisation
    from ..models.single_file import inspect_single_file

    info = inspect_single_file(path)
    n = len(info.prefix)
    header = read_safetensors_header(path)
    extra = detect_quantisation(header).extra_keys
    return {
        k[n:]: tuple(v.get("shape", ()))
        for k, v in header.items()
        if k.startswith(info.prefix) and k != "__metadata__" and k not in extra
    }


def lora_keys(model: Any) -> ModelKeys:
    """The LoRA key table of a worker's loaded model (names and shapes; its own stage's and the rest)."""
    return _patcher(model).keys


def _keys(model: Any) -> ModelKeys:
    comps = model.components
    return model_keys(
        comps.family,
        comps.transformer,
        comps.transformer_config,
        original=original_layout(comps),
        encoders=comps.text_encoders,
    )


def _patcher(model: Any) -> LoraPatcher:
    """The model's patcher, made on first use (it lives and dies with the loaded model)."""
    if model.lora is None:
        spaces = {TRANSFORMER: model.components.transformer, **model.components.text_encoders}
        model.lora = LoraPatcher(_keys(model), spaces)
    return model.lora


def _second_expert_patcher(model: Any) -> LoraPatcher | None:
    """The second expert's patcher (made on first use), or None for a one-transformer model."""
    if model.expert_2 is None:
        return None
    if model.lora_2 is None:
        comps, transformer = model.components, model.expert_2[0].transformer
        keys = model_keys(comps.family, transformer, comps.transformer_config, original=None, encoders={})
        model.lora_2 = LoraPatcher(keys, {TRANSFORMER: transformer})
    return model.lora_2


def bring_to_stack(model: Any, stack: Sequence[StackEntry], part: str) -> dict[str, int]:
    """Patch (or unpatch) ``part`` ("transformer": both experts of a two-expert model, or "text") of the
    loaded ``model`` to ``stack``."""
    if not stack and model.lora is None:
        return {"recomputed": 0, "restored": 0}  # never patched: nothing to do
    patcher = _patcher(model)
    if part != "transformer":
        return patcher.apply(tuple(stack), list(model.components.text_encoders))
    counts = patcher.apply(tuple(stack), [TRANSFORMER])
    second = _second_expert_patcher(model)
    if second is not None:
        more = second.apply(tuple(stack), [TRANSFORMER])
        counts = {k: counts.get(k, 0) + more.get(k, 0) for k in {*counts, *more}}
    return counts
