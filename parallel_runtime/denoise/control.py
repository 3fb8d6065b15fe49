"""ControlNets on a conditioning entry: what ComfyUI's ControlNetApplyAdvanced attaches and how the
residuals of a chain are formed for one model call.

An entry's ``control`` is a chain (ControlNetApplyAdvanced on a conditioning that already has one links
the new ControlNet after the old). At a model call every link whose start/end percent window holds the
current sigma runs its ControlNet on the call's input and adds ``strength`` x its per-block residuals to
those of the others; a link outside its window adds nothing (comfy/controlnet.py ``get_control``: the
window test on the batch's first sigma, ``control_merge``: the strength product and the sum over the chain).
A strength of 0 contributes nothing at all (the ControlNet is not run), which equals no ControlNet exactly.

The ControlNet model runs beside the main model on the same mesh: its image tokens are split over "sp"
exactly as the main model's are, so each rank's residuals are those of the image tokens it holds.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from ..errors import ConfigError
from ..models.base import Activations, AttentionScope, Conditioning, ModelAdapter
from ..parallel.mesh import ParallelMesh
from ..sampling import ModelSampling
from .caching.specs import BlockCacheSpec, StepCacheSpec

_TOKENS = itertools.count(1)


@dataclasses.dataclass(frozen=True, eq=False)
class ControlLink:
    """One applied ControlNet: its file, the hint in model space and ComfyUI's apply settings."""

    file: str  # the ControlNet file (a key of the workers' ControlNet cache)
    hint: torch.Tensor  # [n, C, H, W]: the hint image VAE-encoded and put in model space (latent_format.process_in)
    strength: float = 1.0
    start_percent: float = 0.0
    end_percent: float = 1.0
    control_type: tuple[int, ...] = ()  # a union ControlNet's mode (SetUnionControlNetType); () = none

    def __post_init__(self) -> None:
        for name in ("strength", "start_percent", "end_percent"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(
                    f"ControlNet {name} is {value!r}",
                    "a ControlNet's strength and start/end percent are finite numbers",
                    f"set {name} on the ControlNet apply node to a number",
                )
        if self.hint.ndim != 4:
            raise ConfigError(
                f"a ControlNet hint of shape {tuple(self.hint.shape)}",
                "the hint is the control image encoded into a latent [batch, channels, height, width]",
                "connect an IMAGE and the model's VAE to the ControlNet apply node",
            )


@dataclasses.dataclass(frozen=True, eq=False)
class ControlChain:
    """An entry's ControlNets, first applied first. Entries batch together only with the same chain (ComfyUI
    batches conditionings that share one ControlNet object); ``token`` names the chain across processes."""

    links: tuple[ControlLink, ...]
    token: int = dataclasses.field(default_factory=lambda: next(_TOKENS))

    def same(self, other: ControlChain | None) -> bool:
        return other is not None and other.token == self.token

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(link.file for link in self.links))

    def to(self, device: torch.device | str) -> ControlChain:
        links = tuple(dataclasses.replace(link, hint=link.hint.to(device)) for link in self.links)
        return ControlChain(links, self.token)


def same_control(a: ControlChain | None, b: ControlChain | None) -> bool:
    """Whether two entries carry the same ControlNets (both none, or one chain)."""
    return a is None and b is None or (a is not None and a.same(b))


class ControlRunner(Protocol):
    """A loaded ControlNet (a family's runner): residuals for every block of the main model."""

    def residuals(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        cond: Conditioning,
        guidance: torch.Tensor | None,
        hint: torch.Tensor,
        control_type: Sequence[int],
        mesh: ParallelMesh,
        attention: AttentionScope,
        main_blocks: Sequence[str],
    ) -> list[torch.Tensor | None]:
        """This rank's residual of its image tokens after each main block (None: nothing added there)."""
        ...

    def layout_tag(self, control_type: Sequence[int]) -> tuple: ...


def refuse_with_cache(
    files: Sequence[str], step_cache: StepCacheSpec | None, block_cache: BlockCacheSpec | None
) -> None:
    """A ControlNet with a step or block cache is refused: a skipped (or partly reused) model call would
    skip the ControlNet too, or add its residuals to blocks the cache does not run."""
    cache = step_cache if step_cache is not None else block_cache
    if not files or cache is None:
        return
    raise ConfigError(
        f"a ControlNet ({', '.join(Path(f).name for f in files)}) with a cache ({cache.describe()})",
        "a step cache skips model calls and a block cache reuses the middle blocks' residual; the ControlNet's "
        "per-block residuals would be left out or added to blocks that do not run",
        "remove the Parallel EasyCache / LazyCache / Block Cache node from this graph, or the ControlNet",
    )


def hint_for_batch(hint: torch.Tensor, per_entry: int, entries: int) -> torch.Tensor:
    """The hint for ``entries`` conditionings of ``per_entry`` latents each: a one-image hint serves every
    latent; otherwise latent i takes hint i mod n (ComfyUI's ``broadcast_image_to``)."""
    if hint.shape[0] == 1:
        return hint
    picked = hint[torch.arange(per_entry, device=hint.device) % hint.shape[0]]
    return picked.repeat(entries, *([1] * (hint.ndim - 1)))


class ActiveLinks:
    """Which links of a chain act at a sigma: ComfyUI compares the batch's sigma with the window's sigmas
    (``percent_to_sigma`` of the model sampling in force), skipping a link while sigma > start or sigma < end."""

    def __init__(self, model_sampling: ModelSampling):
        self.ms = model_sampling
        self._sigmas: dict[float, torch.Tensor] = {}

    def _sigma(self, percent: float) -> torch.Tensor:
        if percent not in self._sigmas:
            self._sigmas[percent] = torch.tensor(self.ms.percent_to_sigma(percent), dtype=torch.float32)
        return self._sigmas[percent]

    def __call__(self, chain: ControlChain | None, sigma: torch.Tensor) -> list[ControlLink]:
        if chain is None:
            return []
        sigma = sigma.float().cpu()
        return [
            link
            for link in chain.links
            if link.strength != 0.0
            and not bool(sigma > self._sigma(link.start_percent))
            and not bool(sigma < self._sigma(link.end_percent))
        ]


def chain_residuals(
    links: Sequence[ControlLink],
    runners: Mapping[str, ControlRunner],
    x_in: torch.Tensor,
    timestep: torch.Tensor,
    cond: Conditioning,
    guidance: torch.Tensor | None,
    entries: int,
    mesh: ParallelMesh,
    attention: AttentionScope,
    main_blocks: Sequence[str],
) -> list[torch.Tensor | None] | None:
    """The summed, strength-weighted residuals of the active ``links`` for a batch of ``entries``
    conditionings (``x_in`` holds each entry's latents in turn); None when no link is active."""
    total: list[torch.Tensor | None] | None = None
    per_entry = x_in.shape[0] // entries
    for link in links:
        runner = runners.get(link.file)
        if runner is None:
            raise ConfigError(
                f"the ControlNet {link.file} is not loaded on this worker",
                "the sampling job loads every ControlNet its conditioning names before denoising",
                "report this as a bug (the job's ControlNet list missed this file)",
            )
        hint = hint_for_batch(link.hint, per_entry, entries).to(x_in.device)
        out = runner.residuals(x_in, timestep, cond, guidance, hint, link.control_type, mesh, attention, main_blocks)
        scaled = [
            None if r is None else r * link.strength if isinstance(r, torch.Tensor) else r.scaled(link.strength)
            for r in out
        ]
        total = scaled if total is None else [combine(a, b) for a, b in zip(total, scaled)]
    return total


@dataclasses.dataclass(frozen=True)
class BlockUpdate:
    """What happens to the image tokens after one main block when a model patch is involved: each patch in
    turn (``img + patch(img)``, in the order they were attached), then the ControlNets' summed residual
    (ComfyUI runs a block's model patches before it adds the ControlNet residuals)."""

    patches: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = ()
    residual: torch.Tensor | None = None

    def apply(self, img: torch.Tensor) -> torch.Tensor:
        for patch in self.patches:
            img = img + patch(img).to(img.dtype)
        return img if self.residual is None else img + self.residual.to(img.dtype)


def apply_update(img: torch.Tensor, update: Any) -> torch.Tensor:
    """The image tokens after one block's update: a residual tensor added, or a model patch's token update
    (one patch, or a :class:`BlockUpdate`) applied."""
    if isinstance(update, torch.Tensor):
        return img + update.to(img.dtype)
    return (update if isinstance(update, BlockUpdate) else BlockUpdate((update,))).apply(img)


def combine(a: Any, b: Any) -> Any:
    """Two links' contributions to one block: residual tensors add up, patches keep their order."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a + b
    a = (
        a
        if isinstance(a, BlockUpdate)
        else BlockUpdate(residual=a)
        if isinstance(a, torch.Tensor)
        else BlockUpdate((a,))
    )
    b = (
        b
        if isinstance(b, BlockUpdate)
        else BlockUpdate(residual=b)
        if isinstance(b, torch.Tensor)
        else BlockUpdate((b,))
    )
    residual = a.residual if b.residual is None else b.residual if a.residual is None else a.residual + b.residual
    return BlockUpdate(a.patches + b.patches, residual)


@dataclasses.dataclass(frozen=True)
class AddResiduals:
    """A ``BlockRunner`` for ``ModelAdapter.forward``: every block in order, adding ``residuals[i]`` (this
    rank's share of the image tokens, or None) to the image tokens after block ``i``."""

    residuals: Sequence[torch.Tensor | None]

    def __call__(self, adapter: ModelAdapter, acts: Activations, attention: AttentionScope) -> Activations:
        if acts.ref_tokens:
            raise ConfigError(
                f"{adapter.family}: a ControlNet together with {acts.ref_tokens} reference-image tokens",
                "the ControlNet's tokens are split like the image's alone; with reference images in the sequence "
                "the shards would not line up",
                "sample reference images (Kontext / edit models) or a ControlNet, not both in one sampler",
            )
        hook = adapter.block_hook
        for i in range(adapter.num_blocks):
            acts = adapter.run_block(acts, i, attention)
            if self.residuals[i] is not None:
                acts = acts.replace(img=apply_update(acts.img, self.residuals[i]))
            if hook is not None:
                hook()
        return acts


def layout_tag(links: Sequence[ControlLink], runners: Mapping[str, ControlRunner]) -> tuple:
    """What the active links change in the attention calls of one model evaluation (the sequence-layout tag)."""
    return tuple(
        (link.file, runners[link.file].layout_tag(link.control_type)) for link in links if link.file in runners
    )
