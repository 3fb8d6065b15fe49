"""Stale-KV attention for PipeFusion: every attention layer keeps K/V of the whole image.

For each self/joint attention module of a stage and each stream (a CFG branch or conditioning entries run
as one call, on the whole image or an area's window: see branches.py) a buffer holds K and V of all its image
tokens, laid out ``[text | image tokens in row-major order]``. A module may
attend over fewer of the item's text tokens than it holds (a block list that sees part of the text):
without sequence parallelism in the stage, whatever is not image is that module's text. When a
patch runs, its fresh image K/V overwrite their slice and the text K/V are written fresh; its
queries then attend over the whole buffer: fresh K/V for the patches already processed in this
round, K/V from the previous round (stale) for the rest. A whole-image item (warmup) writes every
token, so its attention is exact. Before the first whole round has written every token (warmup 0)
the not-yet-written tail is left out of the attention.

Reference images (edit models: FLUX.1 Kontext, Qwen-Image-Edit, FLUX.2) are a fixed segment of the buffer,
``[text | reference tokens | image tokens]``: an item that carries them (whole-image items and each step's first
patch, see pipeline.py) has them after its image tokens, splits them over the "sp" ranks with those and writes
their K/V there; the other patches carry image tokens only and attend over the reference K/V last written.

Sequence parallelism inside a stage (hybrid PipeFusion x USP): the patch's tokens are split over
the "sp" ranks. Ulysses exchanges heads for tokens with one all-to-all as in USP; over the ring
dimension the patch K/V are all-gathered (the same bytes as passing them round the ring), since
each rank keeps the whole image's K/V of its heads in its buffer anyway. Each rank's buffer holds
its Ulysses share of the heads.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Literal

import torch

from ..attention.kernels import select_kernel, usable_backends
from ..attention.ulysses import gather_heads, scatter_heads
from ..attention.usp import SdpaRedirect, check_backend, hiding_mask
from ..errors import ConfigError
from ..models.base import Activations, ModelAdapter, intercepted
from ..parallel.collectives import all_gather_cat
from ..parallel.mesh import ParallelMesh
from ..parallel.sharding import split_sizes


@dataclasses.dataclass(frozen=True)
class ItemTokens:
    """Which tokens the item being computed holds: the image token range and the text count."""

    branch: int  # the stream (branches.Stream.index): entries run as one call, each with its own buffers
    image: tuple[int, int]  # [t0, t1) of the stream's row-major image tokens (its window's, or the whole image's)
    text: int  # text tokens in the joint attention sequence (0 for cross-attention families)
    tokens: int | None = None  # the stream's image tokens (None: the whole image's)
    references: int = 0  # the stream's reference-image tokens (edit models), kept in the buffer after the text
    carries_references: bool = False  # the item's tokens end with them (else it reads their kept K/V)


@dataclasses.dataclass
class _Buffer:
    k: torch.Tensor  # [B, H_mine, T + S, Dk]
    v: torch.Tensor
    filled: int = 0  # image tokens written so far in order (all of them once complete)
    references_written: int = 0  # times the reference tokens' K/V were written (by an item carrying them)


class StaleKVCache:
    """The K/V buffers of one stage's attention layers for one generation.

    ``begin_item`` says which tokens the next forward holds; :meth:`layer` gives the attention
    object a module's scaled_dot_product_attention call goes to (see :func:`run_block_stale`)."""

    def __init__(self, mesh: ParallelMesh, image_tokens: int, backend: str = "auto", stale: bool = True):
        self.mesh = mesh
        self.stale = stale  # False: each item attends only to its own tokens (a baseline for tests/benchmarks)
        self.image_tokens = image_tokens
        self.backend = check_backend(backend, mesh.device)
        self._usable = ("sdpa",) if backend == "sdpa" else usable_backends(mesh.device)
        self._buffers: dict[tuple, _Buffer] = {}
        self.item: ItemTokens | None = None
        self.calls: dict[tuple, int] = {}  # per module key: its calls since begin_item

    def begin_item(self, item: ItemTokens) -> None:
        """The tokens of the next block call (called before each block: it also restarts the call counts)."""
        self.item = item
        self.calls = {}

    def call_key(self, key: tuple) -> tuple:
        """The buffer of a module's next call in this block call: its own for the first, one more per repeat
        (Wan VACE's hint block runs once per control entry, each attending over tokens of its own)."""
        n = self.calls.get(key, 0)
        self.calls[key] = n + 1
        return key if not n else (*key, n)

    def layer(self, key: tuple, order: Literal["first", "last"]) -> LayerAttention:
        return LayerAttention(self, key, order)

    @property
    def buffer_bytes(self) -> int:
        return sum(b.k.numel() * b.k.element_size() + b.v.numel() * b.v.element_size() for b in self._buffers.values())

    # -- the attention itself ---------------------------------------------------------------------
    def attend(
        self,
        key: tuple,
        order: Literal["first", "last"],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
    ) -> torch.Tensor:
        item = self.item
        if item is None:
            raise RuntimeError("StaleKVCache.attend called outside a pipeline item (begin_item was not called)")
        mesh, stats = self.mesh, self.mesh.stats
        sp, me = mesh.size("sp"), mesh.rank("sp")
        t0, t1 = item.image
        refs = item.references if item.carries_references else 0
        img_lens = split_sizes(t1 - t0 + refs, sp)  # the reference tokens are split with the image's
        txt_lens = split_sizes(item.text, sp)
        local = q.shape[2]
        if item.text and local == txt_lens[me] + img_lens[me]:
            lens = [(txt_lens[r], img_lens[r]) for r in range(sp)]
        elif local == img_lens[me]:
            lens = [(0, img_lens[r]) for r in range(sp)]  # image-only attention (PixArt attn1, SD3 attn2)
        elif sp == 1 and img_lens[0] < local < img_lens[0] + item.text:
            lens = [(local - img_lens[0], img_lens[0])]  # a block attending over part of the text (a refiner's)
        else:
            raise RuntimeError(
                f"stale-KV attention got {local} local tokens; the item holds {img_lens[me]} image and "
                f"{txt_lens[me]} text tokens on this rank"
            )
        if k.shape[1] != q.shape[1]:  # grouped-query attention
            reps = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(reps, dim=1), v.repeat_interleave(reps, dim=1)
        num_heads = q.shape[1]
        uly, ring_rank = mesh.size("ulysses"), mesh.rank("ring")
        seq = [a + b for a, b in lens]
        uly_lens = seq[ring_rank * uly : (ring_rank + 1) * uly]
        q, k, v = scatter_heads([q, k, v], mesh.group("ulysses"), stats, uly_lens)
        if mesh.size("ring") > 1:
            ring_lens = [sum(seq[r * uly : (r + 1) * uly]) for r in range(mesh.size("ring"))]
            kv = torch.cat([k, v], dim=-1)
            kv = all_gather_cat(kv, mesh.group("ring"), stats, dim=2, sizes=ring_lens, op="pp_ring")
            k, v = kv.split([k.shape[-1], v.shape[-1]], dim=-1)
        kernel = select_kernel(self.backend, q, v, self._usable)
        if not self.stale:  # patch-local baseline: the item's own (text and image) K/V only
            out = kernel.attend(q, k, v, scale)
            return gather_heads(out, mesh.group("ulysses"), stats, uly_lens, num_heads)
        txt_k, img_k = _split_tokens(k, lens, order)
        txt_v, img_v = _split_tokens(v, lens, order)
        text = sum(n for n, _ in lens)  # the buffer keeps this layer's text slots in front, then the references
        at = text + item.references  # where the image tokens start
        buf = self._buffer(key, item.branch, at + (item.tokens or self.image_tokens), k, v)
        if text:
            buf.k[:, :, :text] = txt_k
            buf.v[:, :, :text] = txt_v
        if refs:
            buf.k[:, :, text:at] = img_k[:, :, t1 - t0 :]
            buf.v[:, :, text:at] = img_v[:, :, t1 - t0 :]
            img_k, img_v = img_k[:, :, : t1 - t0], img_v[:, :, : t1 - t0]
            buf.references_written += 1
        elif item.references and not buf.references_written:
            raise RuntimeError(
                f"stale-KV buffer {(item.branch, *key)}: a patch reads reference K/V no item has computed yet"
            )
        buf.k[:, :, at + t0 : at + t1] = img_k
        buf.v[:, :, at + t0 : at + t1] = img_v
        if t0 <= buf.filled:
            buf.filled = max(buf.filled, t1)
        end = at + buf.filled
        out = kernel.attend(q, buf.k[:, :, :end], buf.v[:, :, :end], scale)
        return gather_heads(out, mesh.group("ulysses"), stats, uly_lens, num_heads)

    def _buffer(self, key: tuple, branch: int, size: int, k: torch.Tensor, v: torch.Tensor) -> _Buffer:
        full = (branch, *key)
        buf = self._buffers.get(full)
        if buf is None:
            b, h = k.shape[0], k.shape[1]
            buf = _Buffer(k.new_zeros((b, h, size, k.shape[-1])), v.new_zeros((b, h, size, v.shape[-1])))
            self._buffers[full] = buf
        elif buf.k.shape[:3] != (k.shape[0], k.shape[1], size):
            raise RuntimeError(
                f"stale-KV buffer {full} was made for {tuple(buf.k.shape)} but the item needs batch {k.shape[0]}, "
                f"{k.shape[1]} heads and {size} tokens"
            )
        return buf


def _split_tokens(
    t: torch.Tensor, lens: list[tuple[int, int]], order: Literal["first", "last"]
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Split [B, H, sum(txt_r + img_r), D] (rank pieces in sp order) into (text, image) tokens."""
    txt, img, at = [], [], 0
    for n_txt, n_img in lens:
        if order == "first":
            txt.append(t.narrow(2, at, n_txt))
            img.append(t.narrow(2, at + n_txt, n_img))
        else:
            img.append(t.narrow(2, at, n_img))
            txt.append(t.narrow(2, at + n_img, n_txt))
        at += n_txt + n_img
    has_text = any(n for n, _ in lens)
    text = (txt[0] if len(txt) == 1 else torch.cat(txt, dim=2)) if has_text else None
    image = img[0] if len(img) == 1 else torch.cat(img, dim=2)
    return text, image


class LayerAttention:
    """The scaled_dot_product_attention of one attention module, served from its stale-KV buffer (a buffer per
    call when the module runs several times in one block call: ``StaleKVCache.call_key``)."""

    def __init__(self, cache: StaleKVCache, key: tuple, order: Literal["first", "last"]):
        self.cache, self.key, self.order = cache, key, order

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
        if hiding_mask(attn_mask) is not None or dropout_p or is_causal:
            raise ConfigError(
                "PipeFusion attention got an attention mask, dropout or causal masking",
                "stale-KV attention runs unmasked bidirectional self/joint attention over the whole image",
                "use the model's default processors in eval mode (DiT self/joint attention has no mask)",
            )
        return self.cache.attend(self.cache.call_key(self.key), self.order, query, key, value, scale)

    @contextlib.contextmanager
    def intercept(self) -> Iterator[LayerAttention]:
        """Route F.scaled_dot_product_attention calls inside this scope to this layer's buffer."""
        with SdpaRedirect(self):
            yield self


def run_block_stale(adapter: ModelAdapter, acts: Activations, i: int, cache: StaleKVCache) -> Activations:
    """Block ``i`` with each of its self/joint attention modules served from its own stale-KV buffer."""
    name, blk = adapter.block(i)
    modules = adapter.self_attention_modules(name, blk)
    if adapter.compiled is not None:  # compiled blocks: their router sends each module to its own buffer
        layers = {id(m): cache.layer((i, j), adapter.joint_text_order(m)) for j, m in enumerate(modules)}
        return adapter.compiled.call(adapter, name, blk, acts, lambda module: layers[id(module)])
    with contextlib.ExitStack() as stack:
        for j, module in enumerate(modules):
            stack.enter_context(intercepted([module], cache.layer((i, j), adapter.joint_text_order(module))))
        return adapter.call_block(name, blk, acts)
