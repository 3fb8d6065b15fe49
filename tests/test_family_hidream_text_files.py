"""HiDream-I1's four text encoders from FOUR files (Llama-3.1 bf16 / fp8-scaled, T5-XXL, CLIP-L, CLIP-G), run on the
workers by Parallel Text Encode, against ComfyUI's own QuadrupleCLIPLoader + CLIPTextEncode output from the same tiny
files (tests/data/comfy_hidream_text_reference.json, made by tests/data/make_comfy_hidream_text_reference.py): T5's
128-token chunk (weights, a long prompt cut as ComfyUI cuts it), the projected CLIP-L + CLIP-G pooled output, and
conditioning_llama3 (every Llama layer's states, ComfyUI's weights on them, a prompt past 128 tokens kept whole).
Both sides read the same tiny tokenizers (the generator says why for the Llama one). Fewer files, wrong kinds and
a folder's encoders are refused on the host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.registry import family
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.host_checks import check_text_encoder_files

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "comfy_hidream_text_reference.json").read_text(encoding="utf-8"))
TOKENIZERS = {
    "llama": str(DATA / "tiny_llama_tokenizer"),
    "t5": str(DATA / "tiny_t5_tokenizer"),
    "clip": str(DATA / "tiny_clip_tokenizer"),
}
BOUND = 1e-5


def _tensor(stored: dict) -> torch.Tensor:
    return torch.tensor(stored["data"]).reshape(stored["shape"])


def _choice(name: str) -> tuple[str, str]:
    kind = "llama" if "llama" in name else "t5" if "t5" in name else "clip"
    return str(DATA / name), TOKENIZERS[kind]


def test_workers_encode_like_comfyui_quadrupleclip_loader(pool_registry):
    from parallel_runtime.models.families.hidream.conditioning import HiDreamText
    from parallel_runtime.service.api import LoadRequest, load_parallel_model

    path = str(ensure_tiny_model("tiny-hidream"))
    model = load_parallel_model(
        LoadRequest(model=path, devices="cpu:2", layout=ParallelConfig(ulysses=2)), pool_registry
    )
    worst = {}
    for case, spec in sorted(REFERENCE["cases"].items()):
        files = [_choice(n) for n in spec["files"]]  # QuadrupleCLIPLoader's order: T5, CLIP-G, Llama, CLIP-L
        for prompt, want in zip(REFERENCE["prompts"], spec["conditioning"]):
            cond = model.encode_text(
                prompt, files[0], text_encoder_2=files[1], text_encoder_3=files[2], text_encoder_4=files[3]
            )
            assert isinstance(cond.extras, HiDreamText)
            got = {"cond": cond.prompt_embeds[0], "pooled": cond.pooled[0], "llama3": cond.extras.llama3[0]}
            for part, tensor in got.items():
                expected = _tensor(want[part])
                assert tensor.shape == expected.shape, (case, prompt, part)
                error = (tensor - expected).abs().max().item()
                worst[part] = max(worst.get(part, 0.0), error)
                assert error <= BOUND, (case, prompt, part, error)
    print("max errors vs ComfyUI:", worst)
    with pytest.raises(ConfigError, match=r"three text-encoder files .* for a hidream-i1 model"):
        model.encode_text("a fox", files[0], text_encoder_2=files[1], text_encoder_3=files[2])
    with pytest.raises(ConfigError, match="cannot be encoded by Parallel Text Encode"):
        model.encode_text("a fox")


def test_the_four_files_are_told_apart_and_wrong_ones_refused_on_the_host():
    reader = family("hidream-i1").text_encoder_file()
    names = REFERENCE["cases"]["bf16"]["files"]  # T5, CLIP-G, Llama, CLIP-L
    t5, clip_g, llama, clip_l = (_choice(n) for n in names)
    assert check_text_encoder_files(reader, t5, clip_g, "hidream-i1", (llama, clip_l)) == (llama, t5, clip_l, clip_g)
    assert check_text_encoder_files(reader, clip_l, llama, "hidream-i1", (clip_g, t5)) == (llama, t5, clip_l, clip_g)
    with pytest.raises(ConfigError, match="not one Llama-3.1, one T5-XXL and two CLIPs"):
        check_text_encoder_files(reader, t5, clip_g, "hidream-i1", (clip_l, clip_l[0:1] + (TOKENIZERS["clip"],)))
    with pytest.raises(ConfigError, match="not one Llama-3.1, one T5-XXL and two CLIPs"):
        check_text_encoder_files(reader, t5, clip_g, "hidream-i1", (t5, clip_l))
    with pytest.raises(ConfigError, match="no tokenizer found for tiny_hidream_clip_g"):
        check_text_encoder_files(reader, t5, (clip_g[0], None), "hidream-i1", (llama, clip_l))
    with pytest.raises(ConfigError, match="no tokenizer found for tiny_hidream_llama"):
        check_text_encoder_files(reader, t5, clip_g, "hidream-i1", ((llama[0], None), clip_l))
    with pytest.raises(ConfigError, match=r"one text-encoder file \(tiny_hidream_llama_bf16.safetensors\)"):
        check_text_encoder_files(reader, llama, None, "hidream-i1")
    flux = family("flux").text_encoder_file()  # the others' checks keep their counts
    with pytest.raises(ConfigError, match=r"four text-encoder files .* for a flux model"):
        check_text_encoder_files(flux, t5, clip_l, "flux", (llama, clip_g))


def test_the_node_offers_four_files_and_finds_comfyui_s_llama_and_clip_g_tokenizers(tmp_path):
    from node_helpers import RecordingBridge
    from pack_import import load_pack

    load_pack()
    from dit_parallel_pack.nodes.bridge import SHIPPED_TOKENIZERS
    from dit_parallel_pack.nodes.model_files import TEXT_ENCODER_NONE, resolve_text_encoder
    from dit_parallel_pack.nodes.text_encode import ParallelTextEncode

    encoders, comfy = tmp_path / "text_encoders", tmp_path / "comfy"
    for folder in (encoders, comfy / "text_encoders" / "llama_tokenizer", comfy / "sd1_tokenizer"):
        folder.mkdir(parents=True)
    for name in ("clip_g_hidream.safetensors", "llama_3.1_8b_instruct_fp8_scaled.safetensors"):
        (encoders / name).write_bytes(b"")
    bridge = RecordingBridge(
        folders={"text_encoders": [str(encoders)], SHIPPED_TOKENIZERS: [str(comfy / "text_encoders")]}
    )
    assert resolve_text_encoder("clip_g_hidream.safetensors", bridge)[1] == str(comfy / "sd1_tokenizer")
    llama = resolve_text_encoder("llama_3.1_8b_instruct_fp8_scaled.safetensors", bridge)
    assert llama[1] == str(comfy / "text_encoders" / "llama_tokenizer")
    for name in ("text_encoder_3", "text_encoder_4"):
        socket = next(i for i in ParallelTextEncode.SPEC.inputs if i.name == name)
        assert socket.optional and socket.default == TEXT_ENCODER_NONE  # existing workflows stay valid


def test_the_llama_file_is_spread_by_whole_layers_leaving_room_for_the_other_three(monkeypatch):
    """The existing spread (``load_job.text_file_placement``, ``layer_spread``) covers the Llama: the three
    files read beside it count with it and shrink its first GPU's share; accelerate's plan keeps decoder layers
    whole and in order."""
    from parallel_runtime.models.families.hidream.text_file import load_llama_file
    from parallel_runtime.models.layer_spread import layer_device_map
    from parallel_runtime.service import load_job
    from parallel_runtime.service.load_job import LoadedModel, text_file_placement

    files = REFERENCE["cases"]["bf16"]["files"]
    llama = str(DATA / next(n for n in files if "llama" in n))
    beside = [str(DATA / n) for n in files if "llama" not in n]
    size, extra = Path(llama).stat().st_size, sum(Path(p).stat().st_size for p in beside)
    gpus = ("cuda:0", "cuda:1")
    model = LoadedModel(key=(), components=None, adapter=None, attention="sdpa", devices=gpus)
    room = {"cuda:0": size + extra + 1, "cuda:1": size + extra + 1}
    monkeypatch.setattr(load_job, "free_gpu_bytes", lambda devices: dict(room))
    assert text_file_placement(model, llama, beside) == "cuda:0"  # all four fit one GPU
    room = {g: extra + size // 2 for g in gpus}  # neither GPU alone, both together
    monkeypatch.setattr(load_job, "free_gpu_bytes", lambda devices: dict(room))
    assert text_file_placement(model, llama, beside) == {"cuda:0": room["cuda:0"] - extra, "cuda:1": room["cuda:1"]}
    encoder = load_llama_file(llama, "cpu", torch.float32)
    layer = sum(p.numel() * 4 for p in encoder.layers[0].parameters())
    plan = layer_device_map(encoder, {"cuda:0": 3 * layer, "cuda:1": 8 * layer})
    owners = [plan.get(f"layers.{i}", None) for i in range(len(encoder.layers))]
    assert None not in owners and owners == sorted(owners) and len(set(owners)) == 2, plan


@pytest.fixture(scope="module")
def pooled_192_model(tmp_path_factory):
    """tiny-hidream with the tiny CLIPs' pooled width (64 + 128: ComfyUI's CLIP pools at its own width)."""
    from dit_devtools.tiny.factory import build_tiny_pipeline

    return str(build_tiny_pipeline("tiny-hidream", tmp_path_factory.mktemp("hidream-192") / "m", text_emb_dim=192))


@pytest.mark.parametrize("layout", [ParallelConfig(), ParallelConfig(ulysses=2)], ids=["1 rank", "ulysses 2"])
def test_parallel_text_encode_then_sampler_equals_comfyui_s_conditioning_on_our_sampler(
    pool_registry, pooled_192_model, layout
):
    """Parallel Text Encode (HiDream's four files) -> Parallel Sampler gives the latent that ComfyUI's own
    QuadrupleCLIPLoader + CLIPTextEncode conditioning (the stored reference) gives on the same sampler."""
    from parallel_runtime.models.base import Conditioning
    from parallel_runtime.models.families.hidream.conditioning import HiDreamText
    from parallel_runtime.service.api import LoadRequest, load_parallel_model

    devices = f"cpu:{layout.world_size}"
    model = load_parallel_model(LoadRequest(model=pooled_192_model, devices=devices, layout=layout), pool_registry)
    spec = REFERENCE["cases"]["bf16"]
    files = [_choice(n) for n in spec["files"]]
    kw = dict(width=64, height=48, seed=3, steps=3, cfg=5.0, sampler_name="euler", scheduler="simple")
    latents = {}
    for source in ("ours", "comfyui"):
        branches = []
        for index in (0, 3):  # positive, negative
            if source == "ours":
                branches.append(
                    model.encode_text(
                        REFERENCE["prompts"][index],
                        *files[:1],
                        text_encoder_2=files[1],
                        text_encoder_3=files[2],
                        text_encoder_4=files[3],
                    )
                )
            else:
                want = spec["conditioning"][index]
                branches.append(
                    Conditioning(
                        _tensor(want["cond"])[None],
                        _tensor(want["pooled"])[None],
                        None,
                        HiDreamText(_tensor(want["llama3"])[None]),
                    )
                )
        latents[source] = model.sample(branches[0], branches[1], None, **kw)
    error = (latents["ours"] - latents["comfyui"]).abs().max().item()
    scale = latents["comfyui"].abs().max().item()
    print(f"{layout.describe()}: latent max error {error:.2e} (latent max {scale:.2f})")
    assert latents["ours"].shape == (1, 16, 6, 8) and error <= 1e-4 * max(scale, 1.0)
    other = model.encode_text("", *files[:1], text_encoder_2=files[1], text_encoder_3=files[2], text_encoder_4=files[3])
    moved = (model.sample(other, branches[1], None, **kw) - latents["comfyui"]).abs().max().item()
    assert moved > 1000 * error  # the prompt shows in the latent: the comparison can see a wrong encoding


def test_a_llama_3_1_gguf_encodes_as_the_safetensors_path_on_comfyui_gguf_s_weights(cpu_pool, tmp_path):
    """HiDream's Llama-3.1 as a llama.cpp GGUF (ComfyUI-GGUF's QuadrupleCLIPLoaderGGUF reads it) gives the
    conditioning the safetensors path (equal to ComfyUI above) gives on the weights ComfyUI-GGUF dequantises from
    it, the other three files the same. The tiny Llama is tiny_llava_llama3's (its rows are whole Q8_0 blocks;
    the reference's Llama is 24 wide), with its Llama-3-id tokenizer."""
    import sys

    from bigmodel_files import save
    from llama_gguf_files import write_llama_gguf

    from parallel_runtime.models.families.hidream.text_file import arrange, load_llama_file
    from parallel_runtime.models.gguf.linear import gguf_layers
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    sys.path.insert(0, str(DATA))
    try:
        import tiny_llava_llama3 as tiny
    finally:
        sys.path.remove(str(DATA))
    path = tmp_path / "Meta-Llama-3.1-8B-Instruct-tiny-Q8_0.gguf"
    oracle = save(write_llama_gguf(tiny, path), tmp_path / "llama_3.1_oracle.safetensors")
    assert {layer.kind.name for layer in gguf_layers(load_llama_file(path, "cpu", torch.float32)).values()} == {"Q8_0"}
    t5, clip_g, _, clip_l = (_choice(n) for n in REFERENCE["cases"]["bf16"]["files"])
    assert arrange([clip_g[0], str(path), t5[0], clip_l[0]]) == (1, 2, 3, 0)  # the GGUF is told to be the Llama
    llama = (str(path), str(tiny.TOKENIZER))
    reader = family("hidream-i1").text_encoder_file()
    assert check_text_encoder_files(reader, clip_l, llama, "hidream-i1", (clip_g, t5)) == (llama, t5, clip_l, clip_g)
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-hidream")), "fp32", "sdpa").result(300)
    prompts, tokenizer = REFERENCE["prompts"], str(tiny.TOKENIZER)
    got = pool.submit(encode_text_file, str(path), tokenizer, prompts, None, None, t5, (clip_l, clip_g)).result(300)
    overrides = {"head_dim": tiny.HEAD_DIM}  # the tiny file's; Llama-3.1 8B's is 128
    want = pool.submit(encode_text_file, str(oracle), tokenizer, prompts, None, overrides, t5, (clip_l, clip_g))
    want = want.result(300)
    for a, b in zip(got, want):
        assert a.extras.llama3.shape == b.extras.llama3.shape == (1, tiny.LAYERS, a.extras.llama3.shape[2], tiny.WIDTH)
    worst = max(float((a.extras.llama3 - b.extras.llama3).abs().max()) for a, b in zip(got, want))
    assert worst <= BOUND, worst
    moved = float((got[0].extras.llama3 - got[1].extras.llama3).abs().max())
    assert moved > 1000 * max(worst, 1e-9)  # the prompts differ in the states: the comparison can see a wrong Llama
    print(f"HiDream Llama-3.1 GGUF vs the safetensors path on ComfyUI-GGUF's weights: max |err| {worst:.2e}")
