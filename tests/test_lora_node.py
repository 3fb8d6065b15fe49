"""The Parallel LoRA Loader node: ComfyUI's models/loras list, stacking by chaining on one warm pool,
checks before any sampler runs, and the same picture as the runtime API with the same stack."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from node_helpers import RecordingBridge
from pack_import import load_pack  # tests/ helper

from parallel_runtime.errors import ConfigError
from parallel_runtime.service.lora import LoraSpec

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.latent import ParallelEmptyLatent  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.lora import ParallelLoraLoader  # noqa: E402
from dit_parallel_pack.nodes.model_files import lora_choices, resolve_lora  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402
from dit_parallel_pack.nodes.text_encode import ParallelTextEncode  # noqa: E402

LORAS = Path(__file__).parent / "data" / "lora"
LOAD = dict(family="auto", ulysses=1, ring=1, cfg_parallel=1, pipefusion=1, pp_patches=0, pp_warmup=1, dtype="fp32")


@pytest.fixture(scope="module")
def loras_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "loras"
    (folder / "flux").mkdir(parents=True)
    for stem in ("flux_kohya", "flux_peft", "sd3_kohya"):
        shutil.copy(LORAS / f"{stem}.safetensors", folder / "flux" / f"{stem}.safetensors")
    (folder / "readme.txt").write_text("not a LoRA")
    return folder


@pytest.fixture(scope="module")
def ctx(pool_registry, loras_folder):
    return NodeContext.create(registry=pool_registry, bridge=RecordingBridge(folders={"loras": [str(loras_folder)]}))


def test_lora_list_and_resolution(ctx, loras_folder):
    bridge = ctx.bridge
    assert lora_choices(bridge) == [
        "flux/flux_kohya.safetensors",
        "flux/flux_peft.safetensors",
        "flux/sd3_kohya.safetensors",
    ]
    assert resolve_lora("flux/flux_peft.safetensors", bridge) == str(loras_folder / "flux" / "flux_peft.safetensors")
    with pytest.raises(ConfigError, match="LoRA 'style.safetensors' was not found") as err:
        resolve_lora("style.safetensors", bridge)
    assert str(loras_folder) in str(err.value)


def load(ctx, devices: str = "cpu:1", layout: str = "manual", **degrees):
    result = ParallelModelLoader(ctx).load(model="tiny-flux", layout=layout, devices=devices, attention="auto",
                                           **{**LOAD, **degrees})  # fmt: skip
    return result["result"][0]


def lora(ctx, handle, name: str, strength_model: float, strength_clip: float):
    out = ParallelLoraLoader(ctx).load_lora(handle, f"flux/{name}.safetensors", strength_model, strength_clip)
    return out["result"][0], out["ui"]["text"][0]


def sample(ctx, handle) -> torch.Tensor:
    (pos,) = ParallelTextEncode().encode(handle, "a watercolor fox")
    (latent,) = ParallelEmptyLatent().generate(handle, 64, 64, 1)
    (out,) = ParallelSampler(ctx).sample(handle, pos, pos, latent, 5, 3, 1.0, "euler", "simple", 1.0, guidance=3.5)[
        "result"
    ]
    return out["samples"]


def test_chained_loaders_stack_on_the_same_pool_and_equal_the_api(ctx):
    from parallel_runtime.service.lora import LoraSpec

    base = load(ctx)
    first, text = lora(ctx, base, "flux_kohya", 0.8, 0.5)
    assert "8 of 10 modules patch the transformer" in text and "text encoders: 2 text_encoder" in text
    second, _ = lora(ctx, first, "flux_peft", -0.6, 1.0)
    assert [m.spec.name for m in second.modifiers] == ["flux_kohya.safetensors", "flux_peft.safetensors"]
    assert second.pool_id == base.pool_id and base.modifiers == ()
    with_loras = sample(ctx, second)
    plain = sample(ctx, base)
    assert not torch.equal(with_loras, plain)
    model = base.model()
    view = model.with_loras(
        LoraSpec.of(LORAS / "flux_kohya.safetensors", 0.8, 0.5), LoraSpec.of(LORAS / "flux_peft.safetensors", -0.6, 1.0)
    )
    (pos,) = ParallelTextEncode().encode(second, "a watercolor fox")
    assert torch.equal(pos[0][0], view.encode_text("a watercolor fox").prompt_embeds)
    model_only, _ = lora(ctx, base, "flux_kohya", 0.8, 0.0)  # the same conditioning as plain
    (pos,) = ParallelTextEncode().encode(model_only, "a watercolor fox")
    assert torch.equal(pos[0][0], ParallelTextEncode().encode(base, "a watercolor fox")[0][0][0])
    assert not torch.equal(sample(ctx, model_only), plain)  # strength_model patched the sampler's weights
    assert model.pool.starts == 1  # one pool, started once: LoRAs never reload the model
    same, text = lora(ctx, base, "flux_kohya", 0.0, 0.0)
    assert same is base and "strength 0" in text


def test_wrong_family_fails_in_the_loader_node(ctx):
    base = load(ctx)
    with pytest.raises(
        ConfigError, match=r"sd3_kohya.safetensors matches 0 of its 9 diffusion-model modules to this flux model"
    ):
        lora(ctx, base, "sd3_kohya", 1.0, 1.0)


@pytest.mark.parametrize(
    "strengths, needle",
    [((1e6, 1.0), r"strength_model=1e\+06 is out of range"), ((1.0, math.nan), "strength_clip=nan")],
)
def test_the_loader_node_and_the_api_refuse_the_same_strengths(ctx, strengths, needle):
    """Beyond ComfyUI's LoraLoader range (graphs that skip its validation, API calls): one check."""
    base = load(ctx)
    with pytest.raises(ConfigError, match=needle):
        lora(ctx, base, "flux_kohya", *strengths)
    model = base.model()
    spec = LoraSpec.of(LORAS / "flux_kohya.safetensors", *strengths)
    with pytest.raises(ConfigError, match=needle):
        model.with_loras(spec)


def test_with_loras_checks_what_the_node_checks_before_any_job(ctx):
    model = load(ctx).model()
    before = model.pool.submitted
    cases = [
        (LoraSpec.of(LORAS / "sd3_kohya.safetensors"), "matches 0 of its 9 diffusion-model modules to this flux"),
        (LoraSpec.of(LORAS / "flux_kohya.safetensors", math.inf), "strength_model=inf"),
        (LoraSpec.of(LORAS / "flux_kohya.safetensors", -200.0, 0.0), "strength_model=-200 is out of range"),
        (str(LORAS / "flux_kohya.safetensors"), "with_loras got str"),
    ]
    for spec, needle in cases:
        with pytest.raises(ConfigError, match=needle) as info:
            model.with_loras(spec)
        assert "fix:" in str(info.value)
    assert model.pool.submitted == before
    assert model.with_loras(LoraSpec.of(LORAS / "flux_kohya.safetensors", 100.0)).loras  # the range's end is fine


# -- the workflow file with two stacked LoRAs, on every layout ----------------------------------------
WORKFLOW = Path(__file__).resolve().parent.parent / "workflows" / "flux_two_loras.json"
STEPS = 3


def run_two_lora_workflow(pool_registry, models: Path, monkeypatch, devices: str, **degrees) -> torch.Tensor:
    """workflows/flux_two_loras.json through our node classes on tiny-flux (LoRA files from the tests)."""
    import importlib
    import json

    from test_workflows import run_ui_workflow

    pack = load_pack().__name__
    bridge = importlib.import_module(f"{pack}.nodes.bridge")
    monkeypatch.setenv("DIT_PARALLEL_MODELS", str(models))  # the bridge's folders without ComfyUI
    data = json.loads(WORKFLOW.read_text(encoding="utf-8"))
    loaders = [n for n in data["nodes"] if n["type"] == "DiTParallelLoraLoader"]
    for node, name in zip(loaders, ("flux/flux_kohya.safetensors", "flux/flux_peft.safetensors")):
        node["widgets_values"][0] = name
    layout = "manual" if degrees else "auto"
    overrides = {
        "DiTParallelModelLoader": {
            "model": "tiny-flux",
            "devices": devices,
            "layout": layout,
            "dtype": "fp32",
            **degrees,
        },
        "DiTParallelEmptyLatent": {"width": 64, "height": 64},
        "DiTParallelSampler": {"steps": STEPS, "cfg": 2.0},  # true CFG, so CFG parallel has two branches
    }
    context = importlib.import_module(f"{pack}.nodes.context").NodeContext.create(
        registry=pool_registry, bridge=bridge.ComfyBridge()
    )
    outputs = run_ui_workflow(data, context, overrides)
    sampler = next(n for n in data["nodes"] if n["type"] == "DiTParallelSampler")
    return outputs[sampler["id"]][0]["samples"]


@pytest.fixture(scope="module")
def one_rank_result(pool_registry, loras_folder):
    with pytest.MonkeyPatch.context() as mp:
        return run_two_lora_workflow(pool_registry, loras_folder.parent, mp, "cpu:1", ulysses=1)


@pytest.mark.parametrize(
    "degrees",
    [{"ulysses": 2}, {"cfg_parallel": 2}, {"pipefusion": 2, "pp_patches": 2, "pp_warmup": STEPS}],
    ids=["ulysses2", "cfg2", "pipefusion2"],
)
def test_two_lora_workflow_runs_on_every_layout(pool_registry, loras_folder, monkeypatch, one_rank_result, degrees):
    out = run_two_lora_workflow(pool_registry, loras_folder.parent, monkeypatch, "cpu:2", **degrees)
    assert float((out - one_rank_result).norm() / one_rank_result.norm()) <= 1e-5
