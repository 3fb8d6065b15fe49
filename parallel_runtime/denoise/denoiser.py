"""Denoiser: ``x, sigma -> denoised`` for the whole latent with classifier-free guidance (batched,
one branch after the other, or CFG-parallel over the mesh), and the conditioning batching helpers
the PipeFusion pipeline shares."""

from __future__ import annotations

import torch

from ..attention.usp import SequenceParallelAttention
from ..errors import ConfigError
from ..models.base import Conditioning, ModelAdapter
from ..parallel.collectives import all_gather_cat
from ..parallel.mesh import ParallelMesh
from ..sampling import ModelSampling, cfg_combine, uses_uncond
from .settings import embedded_guidance


class Denoiser:
    """``denoiser(x, sigma) -> denoised`` for the whole latent, with classifier-free guidance.

    cfg mesh dimension of 2: rank cfg=0 evaluates the positive branch, cfg=1 the negative, and one
    all-gather over "cfg" gives both ranks both predictions (exact). Otherwise both branches run
    batched in one forward when their text shapes agree (as ComfyUI does), else one after another.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        mesh: ParallelMesh,
        model_sampling: ModelSampling,
        positive: Conditioning,
        negative: Conditioning | None,
        cfg: float,
        guidance: float | None = None,
        attention_backend: str = "auto",
    ):
        self.adapter, self.mesh, self.ms = adapter, mesh, model_sampling
        self.cfg = cfg
        self.use_uncond = uses_uncond(cfg, negative)
        self.positive, self.negative = positive, negative
        self.guidance = embedded_guidance(adapter, guidance)
        self.attention = SequenceParallelAttention(mesh, attention_backend)
        self.cfg_parallel = self.use_uncond and mesh.size("cfg") == 2
        self.denoise_mask: torch.Tensor | None = None  # a LATENT's noise mask (the model may read it)
        self.evaluations = 0

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Denoised prediction of one (possibly batched) branch."""
        ms, adapter = self.ms, self.adapter
        sigma_b = sigma.reshape(1).expand(x.shape[0])
        per_sample = sigma_b.reshape(-1, *([1] * (x.ndim - 1)))  # broadcasts over [B, C, (T,) H, W]
        x_in = ms.calculate_input(per_sample, x)
        timestep = ms.timestep(sigma_b)
        if self.denoise_mask is not None:
            mask = self.denoise_mask.repeat(x.shape[0] // self.denoise_mask.shape[0], *([1] * (x.ndim - 1)))
            timestep = adapter.process_timestep(timestep, mask)
        self.attention.begin_forward((tuple(x.shape), tuple(cond.prompt_embeds.shape)))
        out = adapter.forward(x_in, timestep, cond, self.mesh, self.attention, guidance=self.guidance)
        self.evaluations += 1
        return ms.calculate_denoised(per_sample, out.float(), x)

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        x = x.float()
        sigma = torch.as_tensor(sigma, dtype=torch.float32).reshape(())
        if not self.use_uncond:
            return self._forward(x, sigma, self.positive)
        if self.cfg_parallel:
            mine = self.positive if self.mesh.rank("cfg") == 0 else self.negative
            pred = self._forward(x, sigma, mine)
            both = all_gather_cat(pred.contiguous(), self.mesh.group("cfg"), self.mesh.stats, dim=0, op="cfg")
            cond_pred, uncond_pred = both.chunk(2, dim=0)
            return cfg_combine(cond_pred, uncond_pred, self.cfg)
        pos, neg = self.positive, self.negative
        if can_batch(pos, neg):
            both = concat_conditioning(pos, neg)
            pred = self._forward(torch.cat([x, x]), sigma, both)
            cond_pred, uncond_pred = pred.chunk(2, dim=0)
        else:
            cond_pred, uncond_pred = self._forward(x, sigma, pos), self._forward(x, sigma, neg)
        return cfg_combine(cond_pred, uncond_pred, self.cfg)


def can_batch(a: Conditioning, b: Conditioning) -> bool:
    """Whether two conditionings can run as one batch: the same optional parts, of the same shapes."""
    for x, y in zip(a.tensors().values(), b.tensors().values()):
        if (x is None) != (y is None) or (x is not None and x.shape[1:] != y.shape[1:]):
            return False
    return True


def concat_conditioning(a: Conditioning, b: Conditioning) -> Conditioning:
    """``a`` and ``b`` as one batch (``a`` first)."""

    def cat(x, y):
        return None if x is None else torch.cat([x, y.to(x.dtype)])

    return Conditioning(**{name: cat(x, y) for (name, x), y in zip(a.tensors().items(), b.tensors().values())})


def expand_conditioning(cond: Conditioning | None, batch: int) -> Conditioning | None:
    """Repeat a single conditioning over the latent batch (ComfyUI does the same)."""
    if cond is None or all(t is None or t.shape[0] == batch for t in cond.tensors().values()):
        return cond
    if any(t is not None and t.shape[0] not in (1, batch) for t in cond.tensors().values()):
        sizes = {name: t.shape[0] for name, t in cond.tensors().items() if t is not None}
        raise ConfigError(
            f"conditioning has batch sizes {sizes} but the latent has batch {batch}",
            "each latent in the batch needs one conditioning (or one shared by all)",
            "encode one prompt, or as many prompts as latents",
        )

    def rep(t):
        return None if t is None or t.shape[0] == batch else t.expand(batch, *t.shape[1:]).contiguous()

    return Conditioning(**{name: rep(t) for name, t in cond.tensors().items()})
