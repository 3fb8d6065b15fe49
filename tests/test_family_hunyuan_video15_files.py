"""HunyuanVideo 1.5 from the single files ComfyUI users keep in models/diffusion_models: Tencent's release layout
(``ckpts/transformer/<variant>/diffusion_pytorch_model.safetensors``: the double blocks' q/k/v apart) and Comfy-Org's
repackaged files (``hunyuanvideo1.5_720p_t2v_fp16.safetensors``: fused ``img_attn_qkv`` / ``txt_attn_qkv``; and
``..._fp8_scaled``). The tiny files are written from the tiny diffusers transformer by the inverse of diffusers'
``scripts/convert_hunyuan_video1_5_to_diffusers.py`` (stated here as names, apart from the loader's table).
Oracles: the diffusers folder (state dicts equal, the same samples on 1 rank, Ulysses 2 and PipeFusion 2), the file's
own weights upcast (fp8), the folder's PipeFusion stage."""

from __future__ import annotations

import contextlib

import pytest
import torch
from bigmodel_files import save, to_fp8  # tests/ helpers
from hunyuan_video15_original import to_original
from original_layout_files import PREFIX, same_config_value, write_header_only

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.errors import ConfigError
from parallel_runtime.models import Conditioning, get_adapter
from parallel_runtime.models.families.hunyuan_video15 import T2V
from parallel_runtime.models.families.hunyuan_video15.conditioning import GlyphText
from parallel_runtime.models.families.hunyuan_video15.keys import LAYOUT, skeleton
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer, shipped_config
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh

NAME = "tiny-hunyuan-video-1.5"
FAMILY = "hunyuan-video-1.5"


@pytest.fixture(scope="module")
def folder():
    return load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32, parts=("transformer",))


@pytest.fixture(scope="module")
def files(tmp_path_factory, folder) -> dict:
    """The tiny transformer as Tencent's file, Comfy-Org's fp16-style file and its fp8-scaled variant."""
    root = tmp_path_factory.mktemp("hv15-files")
    state = folder.transformer.state_dict()
    comfy = to_original(state, fused=True)
    return {
        "tencent": save(to_original(state, fused=False), root / "diffusion_pytorch_model.safetensors"),
        "comfy": save(comfy, root / "hunyuanvideo1.5_480p_t2v_fp16.safetensors"),
        "comfy-prefixed": save(comfy, root / "hunyuanvideo1.5_ckpt.safetensors", PREFIX),
        "fp8": save(to_fp8(comfy, "scaled"), root / "hunyuanvideo1.5_480p_t2v_fp8_scaled.safetensors"),
    }


def test_both_layouts_convert_to_the_folders_tensors_and_the_skeleton_is_tencents(folder):
    """The loader's conversion of either layout gives back exactly the diffusers tensors; names cross-checked against
    public listings of the real files (Tencent's 720p_t2v header: img_attn_q/k/v apart, a fused refiner qkv;
    musubi-tuner: ``double_blocks.0.img_attn_qkv.weight`` in Comfy-Org's files; ComfyUI-GGUF's ``hyvid`` markers)."""
    state = folder.transformer.state_dict()
    for fused in (False, True):
        original = to_original(state, fused)
        names = set(original)
        assert {"double_blocks.0.img_attn_proj.weight", "txt_in.individual_token_refiner.blocks.1.self_attn_qkv.weight",
                "vision_in.proj.4.bias", "cond_type_embedding.weight", "byt5_in.layernorm.weight"} <= names  # fmt: skip
        assert ("double_blocks.0.img_attn_qkv.weight" in names) == fused
        assert ("double_blocks.1.txt_attn_k.weight" in names) != fused
        left = dict(original)
        back = LAYOUT.to_diffusers(left, folder.transformer_config)
        assert not left and sorted(back) == sorted(state) and all(torch.equal(back[k], state[k]) for k in state)
    tencent = to_original(state, fused=False)
    assert skeleton(folder.transformer_config) == {k: tuple(v.shape) for k, v in tencent.items()}


@pytest.mark.parametrize("layout", ["tencent", "comfy", "comfy-prefixed"])
def test_single_file_loads_the_same_transformer_as_the_folder(files, folder, layout):
    info = inspect_single_file(files[layout])
    assert (info.family, info.variant, info.prefix) == (FAMILY, T2V, PREFIX if layout == "comfy-prefixed" else "")
    model, family, scheduler = load_single_file_transformer(files[layout], "cpu", torch.float32)
    for key, value in folder.transformer.config.items():
        if not key.startswith("_"):
            assert same_config_value(model.config[key], value), key
    got, ref = model.state_dict(), folder.transformer.state_dict()
    assert sorted(got) == sorted(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    assert family == FAMILY and scheduler == shipped_config(T2V)[1]


def test_published_sizes_from_a_header_only_file(tmp_path):
    """The 8.3B release's names and shapes (Tencent's layout, written from the shipped config; the refiner's fused
    q/k/v 6144 x 2048 as in the release header) give back the shipped config, 54 blocks for PipeFusion to split."""
    from parallel_runtime.models.model_info import model_info_from_path

    base, _ = shipped_config(T2V)
    shapes = skeleton(base)
    assert shapes["txt_in.individual_token_refiner.blocks.0.self_attn_qkv.weight"] == (6144, 2048)
    assert shapes["img_in.proj.weight"] == (2048, 65, 1, 1, 1) and shapes["byt5_in.fc1.weight"] == (2048, 1472)
    info = inspect_single_file(write_header_only(tmp_path / "hunyuanvideo1.5_720p_t2v_fp16.safetensors", shapes))
    assert info.family == FAMILY and all(same_config_value(info.config[k], v) for k, v in base.items())
    planned = model_info_from_path(info.path)
    assert (planned.num_heads, planned.num_layers, planned.hidden_size) == (16, 54, 2048)
    assert len(planned.block_bytes) == 54 and 16.0e9 < planned.weight_bytes < 17.2e9


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"time_r_in.mlp.0.weight": (2048, 256)}, "MeanFlow"),
        ({"guidance_in.mlp.0.weight": (2048, 256)}, "guidance"),
        ({"img_in.proj.weight": (2048, 98, 1, 1, 1)}, "super-resolution"),
    ],
    ids=["step-distilled", "guidance", "sr"],
)
def test_files_the_engine_cannot_run_are_refused_on_the_host(tmp_path, extra, words):
    shapes = {**skeleton(shipped_config(T2V)[0]), **extra}
    with pytest.raises(ConfigError, match=words):
        inspect_single_file(write_header_only(tmp_path / "hv15.safetensors", shapes))


def test_unknown_layouts_get_a_clear_error(tmp_path, folder):
    state = folder.transformer.state_dict()
    with pytest.raises(ConfigError, match="diffusers' tensor names"):  # a diffusers state dict saved as one file
        load_single_file_transformer(save(state, tmp_path / "diffusers_names.safetensors"), "cpu", torch.float32)
    odd = {k.replace("_attn_q.", "_attn_query."): v for k, v in to_original(state, fused=False).items()}
    with pytest.raises(ConfigError, match="does not fit"):  # another naming of the double blocks' q
        load_single_file_transformer(save(odd, tmp_path / "renamed.safetensors"), "cpu", torch.float32)


class Plain:
    """Attention as it is: F.scaled_dot_product_attention on one device."""

    def intercept(self):
        return contextlib.nullcontext()


def test_fp8_scaled_file_keeps_fp8_layers_and_computes_as_its_upcast_weights(files):
    """ComfyUI's scaled fp8: each fused q/k/v is split under its one scale (a PipeFusion stage reads only its
    rows); kept in fp8 it computes as the same file loaded upcast."""
    from parallel_runtime.models.fp8 import fp8_layers

    kept, _, _ = load_single_file_transformer(files["fp8"], "cpu", torch.float32)
    upcast, _, _ = load_single_file_transformer(files["fp8"], "cpu", torch.float32, storage="compute")
    assert {"transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_v_proj"} <= set(fp8_layers(kept))
    assert not fp8_layers(upcast)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, 2, 3, 4, generator=g)
    cond = Conditioning(torch.randn(1, 7, 32, generator=g), extras=GlyphText(torch.randn(1, 4, 32, generator=g)))
    with torch.no_grad():
        a = get_adapter(kept).forward(x, torch.tensor([600.0]), cond, ParallelMesh.single(), Plain())
        b = get_adapter(upcast).forward(x, torch.tensor([600.0]), cond, ParallelMesh.single(), Plain())
    assert (a - b).abs().max().item() <= 1e-5


def test_pipefusion_stage_reads_only_its_share_and_equals_the_folder_stage(files):
    from parallel_runtime.pipefusion.stage_loading import load_single_file_stage, load_stage_transformer

    for stage in (0, 1):
        comps, plan, weights = load_single_file_stage(files["comfy"], 2, stage, "cpu", torch.float32)
        ref, ref_plan, ref_weights = load_stage_transformer(ensure_tiny_model(NAME), 2, stage, "cpu", torch.float32)
        assert plan.bounds == ref_plan.bounds and weights == ref_weights
        got, want = dict(comps.transformer.named_parameters()), dict(ref.named_parameters())
        assert got.keys() == want.keys()
        mine = tuple(f"transformer_blocks.{j}." for j in range(plan.bounds[stage], plan.bounds[stage + 1]))
        for name, value in want.items():
            assert got[name].device == value.device, name
            if name.startswith("transformer_blocks.") and not name.startswith(mine):
                assert value.device.type == "meta", name  # another stage's block: never read
            if value.device.type != "meta":
                assert torch.equal(got[name], value), name


def _case():
    g = torch.Generator().manual_seed(4)
    pos = Conditioning(torch.randn(1, 9, 32, generator=g), extras=GlyphText(torch.randn(1, 5, 32, generator=g)))
    neg = Conditioning(torch.randn(1, 6, 32, generator=g), extras=GlyphText(torch.randn(1, 0, 32)))
    settings = SamplingSettings(seed=5, steps=2, cfg=4.0, sampler="euler", scheduler="simple")
    return pos, neg, torch.zeros(1, 8, 3, 3, 5), settings  # 45 tokens: divisible by neither 2 nor 4


def _sample(transformer, pos, neg, latent, settings) -> torch.Tensor:
    adapter = get_adapter(transformer)
    return denoise_latent(adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, latent, settings)


@torch.no_grad()
def test_file_samples_as_the_folder_on_one_rank_ulysses2_and_pipefusion2(cpu_pool, files, folder):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import generate

    pos, neg, latent, settings = _case()
    expected = _sample(folder.transformer, pos, neg, latent, settings)
    model, _, _ = load_single_file_transformer(files["tencent"], "cpu", torch.float32)
    _close(_sample(model, pos, neg, latent, settings), expected, 1e-6, "one rank")  # equal weights: rounding only
    for config, kwargs in ((ParallelConfig(ulysses=2), {}), (ParallelConfig(pp=2), {"patches": 3, "warmup": 2})):
        pool = cpu_pool(config)
        pool.submit(load_model, str(files["comfy"]), "fp32", "sdpa").result(300)
        got = pool.submit(generate, pos, neg, latent, settings, **kwargs).result(600)
        _close(got, expected, 1e-5, str(config))


def _close(got: torch.Tensor, expected: torch.Tensor, tol: float, where: str) -> None:
    err = ((got - expected).norm() / expected.norm()).item()
    assert got.shape == expected.shape and err <= tol, f"{where}: relative L2 error {err:.2e}"


RANK = 2
LORA_CASES = {  # module name in the file -> the diffusers tensors it patches (rows of a fused original: in order)
    "lora_unet_double_blocks_0_img_attn_q": ["transformer_blocks.0.attn.to_q.weight"],  # kohya / musubi-tuner
    "diffusion_model.double_blocks.1.txt_mlp.fc1": ["transformer_blocks.1.ff_context.net.0.proj.weight"],
    "diffusion_model.txt_in.individual_token_refiner.blocks.0.self_attn_qkv": [
        f"context_embedder.token_refiner.refiner_blocks.0.attn.to_{p}.weight" for p in "qkv"
    ],
    "transformer.transformer_blocks.1.attn.add_v_proj": ["transformer_blocks.1.attn.add_v_proj.weight"],  # PEFT
}


def test_lora_files_in_tencent_s_names_patch_by_the_formula(tmp_path):
    """W + strength * alpha / rank * up @ down on the tensors each name means, routed through the skeleton in
    Tencent's names (a fused refiner q/k/v patch lands on to_q, to_k and to_v rows) for the folder's model."""
    from safetensors.torch import save_file

    from parallel_runtime.models.lora.files import lora_file_id
    from parallel_runtime.models.lora.keymap import TRANSFORMER
    from parallel_runtime.models.lora.model_keys import model_keys
    from parallel_runtime.models.lora.patcher import LoraPatcher, StackEntry

    comps = load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32, parts=("transformer",))
    model = comps.transformer
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(9)
    tensors, expected = {}, {}
    for module, targets in LORA_CASES.items():
        rows = sum(params[t].shape[0] for t in targets)
        down, up = torch.randn(RANK, params[targets[0]].shape[1], generator=g), torch.randn(rows, RANK, generator=g)
        kohya = module.startswith("lora_unet_")
        tensors[f"{module}.{'lora_down' if kohya else 'lora_A'}.weight"] = down
        tensors[f"{module}.{'lora_up' if kohya else 'lora_B'}.weight"] = up
        alpha = 1.0 if kohya else RANK
        if kohya:
            tensors[f"{module}.alpha"] = torch.tensor(alpha)
        delta = 0.7 * alpha / RANK * (up @ down)
        for target, part in zip(targets, delta.split([params[t].shape[0] for t in targets])):
            expected[target] = params[target] + part
    path = tmp_path / "hunyuan_video15_lora.safetensors"
    save_file(tensors, str(path))
    patcher = LoraPatcher(model_keys(FAMILY, model, comps.transformer_config), {TRANSFORMER: model})
    resolution = patcher.resolution(lora_file_id(path))
    assert resolution.transformer_modules == len(LORA_CASES) and not resolution.unmatched, resolution.summary()
    patcher.apply([StackEntry(lora_file_id(path), 0.7, 0.0)], [TRANSFORMER])
    now = dict(model.named_parameters())
    for name, value in params.items():
        assert torch.allclose(now[name], expected.get(name, value), rtol=0, atol=1e-6), name
    patcher.apply([], [TRANSFORMER])
    assert all(torch.equal(now[k], v) for k, v in params.items())
