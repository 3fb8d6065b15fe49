"""Model adapters: equal to the diffusers forward, exact token splitting, SP-scoped attention."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.errors import ConfigError
from parallel_runtime.models import Conditioning, LatentFormat, get_adapter, supported_class_names
from parallel_runtime.models.families.flux.adapter import image_ids
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.parallel.config import MESH_DIMS, ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.parallel.sharding import split_sizes

torch.set_num_threads(1)
FAMILIES = ("flux", "sd3", "pixart")
SINGLE = ParallelMesh.single()


@pytest.fixture(scope="module", params=FAMILIES)
def adapter(request):
    comps = load_pipeline_components(ensure_tiny_model(f"tiny-{request.param}"), parts=("transformer", "vae"))
    return comps.adapter()


def make_inputs(adapter, batch: int = 2, rows: int = 8, cols: int = 12, text: int = 7, seed: int = 0):
    """Latent, timestep, conditioning and guidance of the right kinds for the adapter's family."""
    g = torch.Generator().manual_seed(seed)
    cfg = adapter.transformer.config
    plan = adapter.plan
    x = torch.randn(batch, plan.latent_channels, rows, cols, generator=g)
    if plan.family == "flux":
        cond = Conditioning(
            torch.randn(batch, text, cfg.joint_attention_dim, generator=g),
            torch.randn(batch, cfg.pooled_projection_dim, generator=g),
        )
        return x, torch.tensor([0.7, 0.25])[:batch], cond, torch.tensor([3.5, 1.5])[:batch]
    if plan.family == "sd3":
        cond = Conditioning(
            torch.randn(batch, text, cfg.joint_attention_dim, generator=g),
            torch.randn(batch, cfg.pooled_projection_dim, generator=g),
        )
        return x, torch.tensor([700.0, 250.0])[:batch], cond, None
    mask = torch.ones(batch, text, dtype=torch.long)
    mask[-1, text // 2 :] = 0  # padded prompt in the last batch entry
    cond = Conditioning(torch.randn(batch, text, cfg.caption_channels, generator=g), None, mask)
    return x, torch.tensor([999, 420])[:batch], cond, None


def diffusers_forward(adapter, x, timestep, cond, guidance):
    """The diffusers transformer's own forward on the same inputs, as the pipelines call it."""
    t, family = adapter.transformer, adapter.plan.family
    if family == "flux":
        rows, cols = adapter.grid_of(x)
        out = t(
            hidden_states=adapter.patchify(x),
            encoder_hidden_states=cond.prompt_embeds,
            pooled_projections=cond.pooled,
            timestep=timestep,
            img_ids=image_ids(rows, cols),
            txt_ids=torch.zeros(cond.prompt_embeds.shape[1], 3),
            guidance=guidance,
        ).sample
        return adapter.unpatchify(out, (rows, cols))
    if family == "sd3":
        return t(x, cond.prompt_embeds, cond.pooled, timestep).sample
    h, w = x.shape[-2] * 8, x.shape[-1] * 8
    added = {
        "resolution": torch.tensor([[h, w]], dtype=torch.float32).repeat(x.shape[0], 1),
        "aspect_ratio": torch.tensor([[h / w]]).repeat(x.shape[0], 1),
    }
    out = t(
        x,
        encoder_hidden_states=cond.prompt_embeds,
        timestep=timestep,
        added_cond_kwargs=added,
        encoder_attention_mask=cond.attention_mask,
    ).sample
    return out[:, : adapter.plan.latent_channels]  # learned sigma: the pipeline keeps the first half


class CountingAttention(SequenceParallelAttention):
    """Single-rank attention that counts intercepted calls and rejects masks (self/joint attention has none)."""

    def __init__(self, mesh):
        super().__init__(mesh)
        self.calls = 0

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        assert attn_mask is None, "a masked (cross-attention) call reached the sequence-parallel attention"
        self.calls += 1
        return F.scaled_dot_product_attention(query, key, value, scale=scale)


def self_attention_count(adapter) -> int:
    return sum(len(adapter.attention_modules(i)) for i in range(adapter.num_blocks))


@torch.no_grad()
def test_forward_equals_diffusers(adapter):
    x, ts, cond, guidance = make_inputs(adapter)
    attention = CountingAttention(SINGLE)
    ours = adapter.forward(x, ts, cond, SINGLE, attention, guidance=guidance)
    ref = diffusers_forward(adapter, x, ts, cond, guidance)
    assert ours.shape == (2, adapter.plan.latent_channels, 8, 12)
    assert (ours - ref).abs().max().item() <= 1e-5
    assert attention.calls == self_attention_count(adapter) > 0  # every self/joint attention, nothing else


@torch.no_grad()
def test_inputs_matter(adapter):
    """Guards the equality test against a degenerate model: guidance / mask / text change the output."""
    x, ts, cond, guidance = make_inputs(adapter)
    base = adapter.forward(x, ts, cond, SINGLE, CountingAttention(SINGLE), guidance=guidance)
    if adapter.plan.family == "flux":
        other = adapter.forward(x, ts, cond, SINGLE, CountingAttention(SINGLE), guidance=guidance * 2)
    elif adapter.plan.family == "pixart":
        mask = torch.ones_like(cond.attention_mask)
        other = adapter.forward(x, ts, Conditioning(cond.prompt_embeds, None, mask), SINGLE, CountingAttention(SINGLE))
    else:
        other = adapter.forward(
            x, ts, Conditioning(cond.prompt_embeds * 2, cond.pooled), SINGLE, CountingAttention(SINGLE)
        )
    assert (base - other).abs().max().item() > 1e-4


def test_plans():
    flux = get_adapter_for("flux").plan
    assert flux.block_lists == ("transformer_blocks", "single_transformer_blocks")
    assert (flux.patch_size, flux.latent_channels, flux.text_attention, flux.guidance_embed) == (2, 16, "joint", True)
    sd3 = get_adapter_for("sd3").plan
    assert (sd3.patch_size, sd3.latent_channels, sd3.timestep, sd3.learned_sigma) == (2, 16, "sigma_x1000", False)
    pixart = get_adapter_for("pixart").plan
    assert (pixart.text_attention, pixart.learned_sigma, pixart.out_channels) == ("cross", True, 8)
    assert {s.field for s in pixart.splits} == {"img"}  # text stays replicated for cross-attention
    assert pixart.latent_format == LatentFormat(4, 0.18215, 0.0)
    assert flux.latent_format == LatentFormat(16, 0.3611, 0.1159)


def get_adapter_for(family: str):
    comps = load_pipeline_components(ensure_tiny_model(f"tiny-{family}"), parts=("transformer", "vae"))
    return comps.adapter()


def test_latent_format_round_trip():
    fmt = LatentFormat(16, 1.5305, 0.0609)
    raw = torch.randn(1, 16, 4, 4)
    assert torch.allclose(fmt.to_raw(fmt.to_model(raw)), raw, atol=1e-6)
    assert LatentFormat.from_vae_config({"latent_channels": 4, "scaling_factor": 0.18215, "shift_factor": None}) == (
        LatentFormat(4, 0.18215, 0.0)
    )


def fake_sp_mesh(rank: int, size: int) -> ParallelMesh:
    """A mesh that only knows its coordinates (ulysses=size): enough for sharding.shard, no groups."""
    coords = dict.fromkeys((*MESH_DIMS, "sp"), 0)
    coords.update(ulysses=rank, sp=rank)
    return ParallelMesh(ParallelConfig(ulysses=size), torch.device("cpu"), dict.fromkeys(coords), coords)


@torch.no_grad()
@pytest.mark.parametrize("sp", [2, 3])
def test_embed_split_reassembles(adapter, sp):
    """Concatenating every sp rank's share gives back the unsplit tokens and rotary rows; the
    replicated fields are identical on every rank. Sizes are uneven (12 x 7 tokens over 3 ranks)."""
    x, ts, cond, guidance = make_inputs(adapter, rows=6, cols=8, text=7)
    full = adapter.embed(x, ts, cond, SINGLE, guidance)
    parts = [adapter.embed(x, ts, cond, fake_sp_mesh(r, sp), guidance) for r in range(sp)]
    assert [p.img.shape[1] for p in parts] == split_sizes(full.img_tokens, sp)
    assert torch.equal(torch.cat([p.img for p in parts], 1), full.img)
    if adapter.plan.text_attention == "joint":
        assert [p.txt.shape[1] for p in parts] == split_sizes(7, sp)
        assert torch.equal(torch.cat([p.txt for p in parts], 1), full.txt)
    else:
        assert all(torch.equal(p.txt, full.txt) and torch.equal(p.txt_mask, full.txt_mask) for p in parts)
    for field in ("img_rope", "txt_rope"):
        if getattr(full, field) is not None:
            for k in range(2):
                assert torch.equal(torch.cat([getattr(p, field)[k] for p in parts], 0), getattr(full, field)[k])
    assert all(torch.equal(p.temb, full.temb) and p.grid == full.grid for p in parts)


class _Redirect(TorchFunctionMode):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            return self.fn(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class ThreadedSP:
    """In-process stand-in for sequence-parallel attention: each rank is a thread; every call
    exchanges K/V with the other ranks (barrier) and attends over the whole sequence."""

    def __init__(self, slots: list, barrier: threading.Barrier, rank: int):
        self.slots, self.barrier, self.rank = slots, barrier, rank

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        assert attn_mask is None
        self.slots[self.rank] = (key, value)
        self.barrier.wait()
        k = torch.cat([s[0] for s in self.slots], dim=2)
        v = torch.cat([s[1] for s in self.slots], dim=2)
        self.barrier.wait()  # everyone has read the slots before they are overwritten
        return F.scaled_dot_product_attention(query, k, v, scale=scale)

    @contextlib.contextmanager
    def intercept(self):
        with _Redirect(self):
            yield self


@torch.no_grad()
def test_sequence_parallel_blocks_match_single(adapter):
    """Three ranks (threads) each embed, run every block on their own uneven token share with
    attention over all ranks' K/V, and project out; the gathered result equals one device."""
    sp = 3
    x, ts, cond, guidance = make_inputs(adapter, rows=6, cols=8, text=7)
    expected = adapter.forward(x, ts, cond, SINGLE, CountingAttention(SINGLE), guidance=guidance)
    slots, barrier = [None] * sp, threading.Barrier(sp, timeout=60)
    outputs, errors = [None] * sp, []

    def rank_main(r: int) -> None:
        try:
            mesh, attention = fake_sp_mesh(r, sp), ThreadedSP(slots, barrier, r)
            acts = adapter.embed(x, ts, cond, mesh, guidance)
            for i in range(adapter.num_blocks):
                acts = adapter.run_block(acts, i, attention)
            outputs[r] = adapter.project_out(acts)
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(sp)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    got = adapter.unpatchify(torch.cat(outputs, dim=1), adapter.grid_of(x))
    assert (got - expected).abs().max().item() <= 1e-5


@torch.no_grad()
def test_intercept_scope_is_removed(adapter):
    x, ts, cond, guidance = make_inputs(adapter, batch=1)
    acts = adapter.embed(x, ts, cond, SINGLE, guidance)
    modules = adapter.attention_modules(0)

    class Boom(CountingAttention):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        adapter.run_block(acts, 0, Boom(SINGLE))
    assert torch._C._len_torch_function_stack() == 0  # the scope closed despite the exception
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in modules)
    # after the adapter ran, the plain diffusers module is untouched: no interception outside run_block
    attention = CountingAttention(SINGLE)
    adapter.run_block(acts, 0, attention)
    diffusers_forward(adapter, x, ts, cond, guidance)
    assert attention.calls == len(modules)


def test_unsupported_transformer_class():
    with pytest.raises(ConfigError) as err:
        get_adapter(torch.nn.Linear(2, 2))
    message = str(err.value)
    assert "Linear is not supported" in message
    assert all(name in message for name in supported_class_names())


def test_refuses_attention_that_bypasses_sdpa():
    from diffusers.models.attention_processor import AttnProcessor

    comps = load_pipeline_components(ensure_tiny_model("tiny-pixart"), parts=("transformer",))
    comps.transformer.transformer_blocks[1].attn1.set_processor(AttnProcessor())  # explicit baddbmm+softmax
    with pytest.raises(ConfigError, match="block 1 of pixart uses attention processor AttnProcessor"):
        get_adapter(comps.transformer)

    comps = load_pipeline_components(ensure_tiny_model("tiny-flux"), parts=("transformer",))
    comps.transformer.single_transformer_blocks[0].attn.processor._attention_backend = "flash"
    with pytest.raises(ConfigError, match="backend 'flash'"):
        get_adapter(comps.transformer)


def test_missing_guidance_is_explained():
    adapter = get_adapter_for("flux")
    x, ts, cond, _ = make_inputs(adapter)
    with pytest.raises(ConfigError, match="needs a guidance value"):
        adapter.embed(x, ts, cond, SINGLE)
