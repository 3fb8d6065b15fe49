"""What a load asks for: the model, the devices and how to split them (:class:`LoadRequest`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..parallel.config import ParallelConfig


def model_key(
    path: str | Path,
    dtype: str,
    pp: int,
    pp_stage_weights: tuple[float, ...] | None = None,
    vae_path: str | None = None,
    vae_norm_groups: int = 32,
    storage: str = "auto",
    dequant_dtype: str = "default",
    expert_2_path: str | None = None,
    boundary: float | None = None,
) -> tuple:
    """Everything that makes one loaded model differ from another: the file, the precision, how its
    weights are stored (and a GGUF file's dequantisation arithmetic), its VAE, and (with PipeFusion
    stages) how its blocks are split, and a second expert's file (Wan 2.2 A14B's low-noise expert) with its
    boundary. The host keys its pools by it and a worker keeps its loaded model by it, so two loads that
    differ in any of these never share (or replace) one another's model."""
    weights = tuple(float(w) for w in pp_stage_weights) if pp > 1 and pp_stage_weights else None
    vae = (str(vae_path), int(vae_norm_groups)) if vae_path is not None else None
    key: tuple = (str(path), dtype, storage, dequant_dtype, vae, pp, weights)
    if expert_2_path is not None:
        key += (("expert_2", str(expert_2_path), None if boundary is None else float(boundary)),)
    return key


@dataclasses.dataclass(frozen=True)
class LoadRequest:
    """What to load and how to split it."""

    model: str  # a built-in ("tiny-flux-shapes", "tiny-flux", ...) | a diffusers folder | a single .safetensors file
    devices: str = "cpu:2"
    layout: ParallelConfig | None = None  # None: Ulysses over every device (the planner picks otherwise)
    dtype: str = "fp32"
    attention: str = "auto"
    family: str | None = None
    threads_per_worker: int | None = None
    pp_patches: int | None = None  # PipeFusion row bands (None: automatic); used when layout.pp > 1
    pp_warmup: int = 1  # PipeFusion steps run synchronously on the whole image first
    pp_stage_weights: tuple[float, ...] | None = None  # relative blocks per stage (None: equal)
    vae: str | None = None  # a VAE .safetensors file to decode with instead of the model's own
    vae_norm_groups: int = 32  # GroupNorm groups of that VAE (32 in every published one)
    storage: str = "auto"  # Linear weights: "auto" (fp8 files stay fp8), "compute" (all in dtype), "fp8_e4m3fn"
    dequant_dtype: str = "default"  # GGUF files: ComfyUI-GGUF's dequantisation arithmetic (models.gguf.DEQUANT_MODES)
    load_timeout_s: float = 1800.0  # a load running longer is abandoned (the workers are restarted)
    # Wan 2.2 A14B from two single files: ``model`` is the high-noise expert, ``expert_2`` the low-noise one's
    # file; one pool holds both and sampling switches below ``expert_boundary`` (a sigma; None: diffusers'
    # boundary_ratio for the pair, 0.875 text-to-video, 0.9 image-to-video).
    expert_2: str | None = None
    expert_boundary: float | None = None
    compile: str = "off"  # "blocks": regional torch.compile of the transformer blocks (models.compiled_blocks)
    # fp8 layers: "auto" (torch._scaled_mm on sm89+), "upcast", "scaled_mm" (models.fp8_matmul)
    fp8_matmul: str = "auto"

    def load_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the load_model job beyond (path, dtype, attention)."""
        kwargs: dict[str, Any] = {}
        if self.pp_stage_weights:
            kwargs["pp_stage_weights"] = tuple(self.pp_stage_weights)
        if self.vae:
            kwargs["vae_path"] = str(Path(self.vae).expanduser().resolve())
            kwargs["vae_norm_groups"] = self.vae_norm_groups
        if self.storage != "auto":
            kwargs["storage"] = self.storage
        if self.dequant_dtype != "default":
            kwargs["dequant_dtype"] = self.dequant_dtype
        if self.expert_2:
            kwargs["expert_2_path"] = str(Path(self.expert_2).expanduser().resolve())
            if self.expert_boundary is not None:
                kwargs["boundary"] = float(self.expert_boundary)
        if self.compile != "off":
            kwargs["compile"] = self.compile
        if self.fp8_matmul != "auto":
            kwargs["fp8_matmul"] = self.fp8_matmul
        return kwargs

    def model_key(self, path: str | Path, pp: int) -> tuple:
        """:func:`model_key` of this request for the model file or folder ``path`` and ``pp`` stages."""
        kwargs = self.load_kwargs()
        for how in ("compile", "fp8_matmul"):  # how the blocks compute, set on every load: the same weights
            kwargs.pop(how, None)
        return model_key(path, self.dtype, pp, **kwargs)
