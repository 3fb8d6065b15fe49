"""Sequence-parallel attention (USP = Ulysses x Ring) with selectable kernels.

CONTRACT (used by the model adapters):
- ``SequenceParallelAttention(mesh, backend)`` is called like ``F.scaled_dot_product_attention``
  with q, k, v of shape [B, H, S_local, D], where S_local is this rank's share of the token
  sequence split over the mesh's "sp" dimension (ranks may hold different counts).
- ``with attn.intercept():`` routes every ``torch.nn.functional.scaled_dot_product_attention``
  call made inside the scope to ``attn``; adapters enter it only around self/joint attention
  modules (never cross-attention, whose K/V are the replicated text tokens).

How it runs (sp = ring x ulysses, sp rank = ring rank * ulysses + ulysses rank, and the sequence
is split over sp ranks in that order):
1. Ulysses (inner): one all-to-all gives each rank of the ulysses group the whole group's tokens
   for its share of heads (``ulysses.py``).
2. Ring (outer): the K/V blocks of the ring group travel around it; partial outputs merge by
   log-sum-exp (``ring.py``). Without a ring the kernel attends once.
3. The inverse all-to-all restores [B, H, S_local, D].
Kernels ("sdpa", "flash", "auto") live in ``kernels.py``. Attention has no mask, so
the result equals single-device attention over the same tokens; a joint [text shard, image shard]
local sequence gives the full joint attention up to that token permutation.

Communication counted in ``mesh.stats``: "ulysses" (4·e·B·S·h·(N-1)/N² per layer and rank for
an even split over N ulysses ranks), "ring" (2·e·B·S·h·(N-1)/N over N ring ranks), "meta"
(the one-off exchange of token counts).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError
from ..parallel.collectives import all_gather_cat
from ..parallel.mesh import ParallelMesh
from .kernels import (
    auto_order,
    backend_names,
    check_backend_device,
    check_backend_name,
    select_kernel,
    usable_backends,
)
from .ring import ring_attention
from .ulysses import gather_heads, scatter_heads

ATTENTION_BACKENDS: tuple[str, ...] = backend_names()
"""Valid backend names: "auto" (flash-attn on CUDA when installed, else SDPA), "sdpa", "flash"."""


def check_backend(name: str, device: str | torch.device | None = None) -> str:
    """Return ``name`` if it is a valid backend (and, given ``device``, can run there).

    Raises ConfigError saying what is wrong, why, and how to fix it (listing the valid names)."""
    check_backend_name(name)
    if device is not None:
        check_backend_device(name, torch.device(device))
    return name


@dataclasses.dataclass(frozen=True)
class SequenceLayout:
    """Token counts behind one local sequence length, as Ulysses and Ring need them."""

    sp_lens: tuple[int, ...]
    """Token count of every sp rank, in sp order."""
    ulysses_lens: tuple[int, ...]
    """Token counts of this rank's ulysses group, in ulysses-rank (= sequence) order."""
    ring_lens: tuple[int, ...]
    """Token count of each ring rank's block (the sum over its ulysses group)."""

    @classmethod
    def from_sp_lens(cls, sp_lens: Sequence[int], ulysses: int, ring_rank: int) -> SequenceLayout:
        sp = tuple(int(n) for n in sp_lens)
        ring = len(sp) // ulysses
        return cls(
            sp_lens=sp,
            ulysses_lens=sp[ring_rank * ulysses : (ring_rank + 1) * ulysses],
            ring_lens=tuple(sum(sp[r * ulysses : (r + 1) * ulysses]) for r in range(ring)),
        )


class SequenceParallelAttention:
    """Attention over a sequence split across the mesh's sp group (Ulysses x Ring).

    With an sp group of one rank the call is ``F.scaled_dot_product_attention`` itself (bit-identical,
    every argument passed through), unless the backend picks another kernel for this device (flash-attn,
    FlashAttention 3, SageAttention, cuDNN): plain calls (no mask, dropout or causal masking) then go to it. In
    parallel mode the attention must be unmasked (or given a mask that hides nothing), non-causal and without
    dropout (what DiT self/joint attention is); other calls raise ConfigError.

    The token counts of the other ranks are exchanged with a tiny all-gather (counted as "meta").
    The engine calls ``begin_forward(tag)`` before each model evaluation with a tag that is equal on
    every rank exactly when the sequence layout is (e.g. the latent shape); the counts are then
    cached per (tag, call number within the forward), so every rank hits or misses the cache
    together and no rank waits alone in the exchange. Without a tag, every call exchanges.
    """

    def __init__(self, mesh: ParallelMesh, backend: str = "auto"):
        self.mesh = mesh
        self.backend = check_backend(backend, mesh.device)
        # Kernels that can run on this device, checked once (may import flash_attn).
        self._usable = ("sdpa",) if backend == "sdpa" else usable_backends(mesh.device)
        order = auto_order(mesh.device)[0] if backend == "auto" else (backend,)
        self._single_kernel = next((name for name in order if name in self._usable), "sdpa")
        self._layouts: dict[tuple, SequenceLayout] = {}
        self._tag: object = None
        self._ordinal = 0

    def begin_forward(self, tag: object) -> None:
        """Start a model evaluation whose sequence layout is identified by ``tag`` (same on all ranks)."""
        self._tag, self._ordinal = tag, 0

    @property
    def parallel(self) -> bool:
        """True when the sequence is split over more than one rank."""
        return self.mesh.size("sp") > 1

    @property
    def routes_sdpa(self) -> bool:
        """Whether a scaled_dot_product_attention call must come here at all (False: plain SDPA would do the
        same, so compiled blocks may keep it in their graph)."""
        return self.parallel or self._single_kernel != "sdpa"

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if not self.parallel:
            plain = attn_mask is None and not dropout_p and not is_causal and query.shape[1] == key.shape[1]
            if self._single_kernel != "sdpa" and plain and query.dim() == 4:
                return select_kernel(self.backend, query, value, self._usable).attend(query, key, value, scale)
            return F.scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        _check_parallel_call(query, key, value, hiding_mask(attn_mask), dropout_p, is_causal, enable_gqa)
        if key.shape[1] != query.shape[1]:  # grouped-query attention: give every query head its K/V
            reps = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(reps, dim=1), value.repeat_interleave(reps, dim=1)
        return self._sequence_parallel(query, key, value, scale)

    def sequence_layout(self, local_len: int, device: torch.device) -> SequenceLayout:
        """Every sp rank's token count for this rank's ``local_len`` (collective on first use)."""
        key = None if self._tag is None else (self._tag, self._ordinal)
        self._ordinal += 1
        layout = self._layouts.get(key) if key is not None else None
        if layout is None:
            mine = torch.tensor([local_len], dtype=torch.int64, device=device)
            sp_lens = all_gather_cat(mine, self.mesh.group("sp"), self.mesh.stats, op="meta").tolist()
            layout = SequenceLayout.from_sp_lens(sp_lens, self.mesh.size("ulysses"), self.mesh.rank("ring"))
            if key is not None:
                self._layouts[key] = layout
        elif layout.sp_lens[self.mesh.rank("sp")] != local_len:
            raise RuntimeError(
                f"attention call {key} has {local_len} local tokens but the cached layout says "
                f"{layout.sp_lens[self.mesh.rank('sp')]}: begin_forward() tags must identify the sequence layout"
            )
        return layout

    def _sequence_parallel(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
    ) -> torch.Tensor:
        mesh, stats = self.mesh, self.mesh.stats
        layout = self.sequence_layout(q.shape[2], q.device)
        kernel = select_kernel(self.backend, q, v, self._usable)
        num_heads = q.shape[1]
        uly_group = mesh.group("ulysses")
        q, k, v = scatter_heads([q, k, v], uly_group, stats, layout.ulysses_lens)
        if mesh.size("ring") > 1:
            out = ring_attention(q, k, v, mesh.group("ring"), stats, layout.ring_lens, kernel.attend_lse, scale)
        else:
            out = kernel.attend(q, k, v, scale)
        return gather_heads(out, uly_group, stats, layout.ulysses_lens, num_heads)

    @contextlib.contextmanager
    def intercept(self) -> Iterator[SequenceParallelAttention]:
        """Route F.scaled_dot_product_attention calls inside this scope to this object."""
        with SdpaRedirect(self):
            yield self


def hiding_mask(attn_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``attn_mask`` when it hides something; None for a mask that hides nothing (a boolean one all True, an
    additive one all 0), which some processors always pass (HunyuanVideo 1.5's builds one from its text mask)."""
    if attn_mask is None:
        return None
    hides = not bool(attn_mask.all()) if attn_mask.dtype == torch.bool else bool(attn_mask.any())
    return attn_mask if hides else None


def _check_parallel_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
) -> None:
    """Raise ConfigError for calls sequence-parallel attention does not support."""
    fix_scope = (
        "enter attn.intercept() only around self/joint attention, or run with ulysses=1 and ring=1 "
        "(the single-rank path passes every argument to torch)"
    )
    if attn_mask is not None:
        raise ConfigError(
            "an attn_mask was passed to sequence-parallel attention",
            "each rank holds only a slice of the sequence, so a mask over the full sequence cannot be applied "
            "here; DiT self/joint attention needs none",
            "drop the mask (pad tokens are not needed for these models) or " + fix_scope,
        )
    if dropout_p:
        raise ConfigError(
            f"dropout_p={dropout_p} was passed to sequence-parallel attention",
            "it is an inference engine: attention dropout would make the result random",
            "call with dropout_p=0.0 (put the model in eval mode)",
        )
    if is_causal:
        raise ConfigError(
            "is_causal=True was passed to sequence-parallel attention",
            "diffusion transformers attend bidirectionally; causal masking over a split sequence is not implemented",
            fix_scope,
        )
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ConfigError(
            f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}",
            "sequence-parallel attention expects 4-D tensors [batch, heads, local tokens, head dim]",
            "reshape to [B, H, S_local, D] before the call",
        )
    if not (q.shape[2] == k.shape[2] == v.shape[2]):
        raise ConfigError(
            f"q has {q.shape[2]} local tokens but k/v have {k.shape[2]}/{v.shape[2]}",
            "sequence-parallel attention is self-attention over one split sequence, so q, k and v are the same "
            "tokens; cross-attention K/V (text) are replicated on every rank, not split",
            "call plain F.scaled_dot_product_attention for cross-attention (" + fix_scope + ")",
        )
    hq, hk = q.shape[1], k.shape[1]
    if (hk != hq and not (enable_gqa and hk and hq % hk == 0)) or v.shape[1] != hk:
        raise ConfigError(
            f"q has {hq} heads but k/v have {hk}/{v.shape[1]} (enable_gqa={enable_gqa})",
            "every query head needs its K/V head; grouped-query attention needs q heads divisible by k/v heads",
            "pass the same head count for q, k and v, or enable_gqa=True with q heads a multiple of k/v heads",
        )


class SdpaRedirect(TorchFunctionMode):
    """Torch function mode that sends F.scaled_dot_product_attention to ``attn`` (any callable with
    its signature); every other function runs unchanged."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self.attn(*args, **kwargs)
        return func(*args, **kwargs)
