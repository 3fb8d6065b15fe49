"""HunyuanVideo image-to-video prompts with the start image's vision tokens (ComfyUI's
TextEncodeHunyuanVideo_ImageToVideo) from ComfyUI's LLaVA-Llama-3 + CLIP-L files: equal to ComfyUI's own
DualCLIPLoader (type hunyuan_video) + TextEncodeHunyuanVideo_ImageToVideo on the same tiny files
(tests/data/comfy_hunyuan_video_i2v_text_reference.json, made by make_comfy_hunyuan_video_i2v_text_reference.py),
for several prompts and image_interleave values, on one device and on the workers (Ulysses 2); the node hands
ComfyUI's CLIP_VISION_OUTPUT and image_interleave to the model, and what cannot be encoded is refused on the host."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from test_family_hunyuan_video_text_files import CLIP, LLAMA_TOKENIZER

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

REFERENCE = json.loads((DATA / "comfy_hunyuan_video_i2v_text_reference.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    sys.path.insert(0, str(DATA))
    try:
        import tiny_llava_llama3
    finally:
        sys.path.remove(str(DATA))
    folder = tmp_path_factory.mktemp("llava-llama3-i2v")
    out = {}
    for case, entry in REFERENCE["cases"].items():
        out[case] = tiny_llava_llama3.write(case, folder)
        assert tiny_llava_llama3.sha256(out[case]) == entry["sha256"], "not the file ComfyUI encoded"
    return out


def _tensor(stored: dict) -> torch.Tensor:
    return torch.tensor(stored["data"]).reshape(stored["shape"])


def mm_projected() -> torch.Tensor:
    recipe = REFERENCE["mm_projected"]
    states = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"])
    assert state_digest({"t": states}) == recipe["digest"]
    return states


def _compare(rows: list, conds: list) -> float:
    worst = 0.0
    for want, cond in zip(rows, conds):
        expected = _tensor(want["cond"])
        assert want["extra"] == [] and cond.attention_mask is None
        assert cond.prompt_embeds.shape == (1, *expected.shape), (want["prompt"], want["image_interleave"])
        worst = max(worst, float((cond.prompt_embeds[0] - expected).abs().max()))
        assert (cond.pooled[0] - _tensor(want["pooled"])).abs().max() <= TOLERANCE
    assert worst <= TOLERANCE, worst
    return worst


def test_one_device_encodes_like_comfyui(files):
    """The vision tokens in the I2V template, every image_interleave-th in front: both files, every case."""
    from transformers import AutoTokenizer

    from parallel_runtime.models.clip_text_file import load_clip_l_file
    from parallel_runtime.models.families.hunyuan_video.text_file import (
        encode_hunyuan_video_files,
        load_llama3_file,
    )

    clip = load_clip_l_file(CLIP[0], "cpu", "CLIP-L").float()
    tokenizers = (AutoTokenizer.from_pretrained(LLAMA_TOKENIZER), AutoTokenizer.from_pretrained(CLIP[1]))
    states = mm_projected()
    for case, entry in REFERENCE["cases"].items():
        llama = load_llama3_file(files[case], "cpu", torch.float32, overrides={"head_dim": REFERENCE["head_dim"]})
        conds = [
            encode_hunyuan_video_files(
                (llama, clip),
                tokenizers,
                [row["prompt"]],
                vision={"states": states, "interleave": row["image_interleave"]},
            )
            for row in entry["conditioning"]
        ]
        _compare(entry["conditioning"], conds)
    # the image is not a no-op: without it the same prompt gives the text-to-video states
    plain = encode_hunyuan_video_files((llama, clip), tokenizers, [REFERENCE["prompts"][0]])
    assert plain.prompt_embeds.shape[1] < _tensor(entry["conditioning"][0]["cond"]).shape[0]


def test_workers_encode_like_comfyui(cpu_pool, files):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-hunyuan-video")), "fp32", "sdpa").result(300)
    overrides = {"head_dim": REFERENCE["head_dim"]}
    states = mm_projected()
    entry = REFERENCE["cases"]["fp8_scaled"]
    conds = []
    for row in entry["conditioning"]:
        vision = {"states": states, "interleave": row["image_interleave"]}
        job = pool.submit(
            encode_text_file, str(files["fp8_scaled"]), str(LLAMA_TOKENIZER), [row["prompt"]], None, overrides, CLIP,
            vision=vision,
        )  # fmt: skip
        conds += job.result(300)
    print("HunyuanVideo I2V text vs ComfyUI on the workers, max |err|:", _compare(entry["conditioning"], conds))


class _Model:
    """Records what the node asks of the parallel model."""

    family = "hunyuan-video"

    def __init__(self):
        self.calls = []

    def encode_text(self, prompt, text_encoder=None, **kwargs):
        from parallel_runtime.models.base import Conditioning

        self.calls.append((prompt, text_encoder, kwargs))
        return Conditioning(torch.zeros(1, 3, 32), torch.zeros(1, 32))


class _VisionOutput:
    def __init__(self, mm_projected):
        self.mm_projected = mm_projected


def test_the_node_hands_over_the_image_and_refuses_what_cannot_be_encoded(files, tmp_path):
    from node_helpers import RecordingBridge, fake_handle  # tests/ helpers
    from pack_import import load_pack  # tests/ helper

    load_pack()
    from dit_parallel_pack.nodes.context import NodeContext
    from dit_parallel_pack.nodes.text_encode import ParallelTextEncodeHunyuanVideoImageToVideo as Node

    folder = tmp_path / "text_encoders"
    folder.mkdir()
    for name, path in (("llava_llama3_fp16.safetensors", files["fp16"]), ("clip_l.safetensors", Path(CLIP[0]))):
        (folder / name).symlink_to(path)
    ctx = NodeContext.create(registry=object(), bridge=RecordingBridge(folders={"text_encoders": [str(folder)]}))
    handle = fake_handle(ctx)
    handle.fake = model = _Model()
    handle.model = lambda: model
    states = mm_projected()
    (cond,) = Node(ctx).encode(
        handle, _VisionOutput(states), "a fox", 4, "llava_llama3_fp16.safetensors", "clip_l.safetensors"
    )
    ((prompt, first, kwargs),) = model.calls
    assert prompt == "a fox" and first[0].endswith("llava_llama3_fp16.safetensors")
    assert kwargs["text_encoder_2"][0].endswith("clip_l.safetensors") and kwargs["vision"]["interleave"] == 4
    assert torch.equal(kwargs["vision"]["states"], states) and cond[0][1]["pooled_output"].shape == (1, 32)
    with pytest.raises(ConfigError, match="mm_projected"):  # a CLIP vision file without LLaVA's projector
        Node(ctx).encode(handle, _VisionOutput(None), "a fox", 2, "llava_llama3_fp16.safetensors", "clip_l.safetensors")
    with pytest.raises(ConfigError, match="image_interleave"):
        Node(ctx).encode(
            handle, _VisionOutput(states), "a fox", 0, "llava_llama3_fp16.safetensors", "clip_l.safetensors"
        )
