"""SD3 / SD3.5's text encoders from their THREE files (CLIP-L, CLIP-G, T5-XXL fp16 / fp8-scaled; any order) or two
of them, run on the workers by Parallel Text Encode, against ComfyUI's own TripleCLIPLoader / DualCLIPLoader (type
sd3) + CLIPTextEncode output from the same tiny files (tests/data/comfy_sd3_text_reference.json, made by
tests/data/make_comfy_sd3_text_reference.py): CLIP-L's and CLIP-G's penultimate states of every 77-token chunk
with ComfyUI's (word:1.3) weights, side by side, zero-padded to T5's width (4096 without T5), T5's 77 padded tokens
after them, the pooled CLIP-L ++ projected CLIP-G output (zeros for a missing one). On one rank and Ulysses 2.
Wrong file combinations are refused on the host."""

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
REFERENCE = json.loads((DATA / "comfy_sd3_text_reference.json").read_text(encoding="utf-8"))
T5_TOKENIZER, CLIP_TOKENIZER = str(DATA / "tiny_t5_tokenizer"), str(DATA / "tiny_clip_tokenizer")
FILES = {
    k: (str(DATA / name), T5_TOKENIZER if k.startswith("t5") else CLIP_TOKENIZER)
    for k, name in REFERENCE["files"].items()
}
BOUND = 1e-5


def _tensor(stored: dict) -> torch.Tensor:
    return torch.tensor(stored["data"]).reshape(stored["shape"])


def _choice(name: str) -> tuple[str, str]:
    return next(f for f in FILES.values() if Path(f[0]).name == name)


@pytest.mark.parametrize("layout", [ParallelConfig(), ParallelConfig(ulysses=2)], ids=["1 rank", "ulysses 2"])
def test_workers_encode_like_comfyui_triple_and_dual_clip_loaders(cpu_pool, layout):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    reader = family("sd3").text_encoder_file()
    pool = cpu_pool(layout)
    pool.submit(load_model, str(ensure_tiny_model("tiny-sd3")), "fp32", "sdpa").result(300)
    worst = {}
    for case, spec in sorted(REFERENCE["cases"].items()):
        given = [_choice(n) for n in spec["files"]]  # ComfyUI's loader's order
        files = check_text_encoder_files(reader, given[0], given[1], "sd3", tuple(given[2:]))
        prompts = [REFERENCE["prompts"][row["prompt"]] for row in spec["conditioning"]]
        got = pool.submit(encode_text_file, *files[0], prompts, None, None, None, files[1:]).result(300)
        for cond, want in zip(got, spec["conditioning"]):
            tokens, expected = cond.prompt_embeds[0], _tensor(want["cond"])
            assert list(tokens.shape) == want["shape"], (case, want["prompt"])
            if want["rest_max"] is not None:  # no T5: 4096 columns, ComfyUI's zero past the CLIPs'
                assert want["rest_max"] == 0.0 and not tokens[:, expected.shape[1] :].any(), case
                tokens = tokens[:, : expected.shape[1]]
            for part, a, b in (("cond", tokens, expected), ("pooled", cond.pooled[0], _tensor(want["pooled"]))):
                error = float((a - b).abs().max())
                worst[part] = max(worst.get(part, 0.0), error)
                assert error <= BOUND, (case, want["prompt"], part, error)
            assert cond.attention_mask is None  # ComfyUI passes no mask
    print(f"{layout.describe()}: max errors vs ComfyUI {worst}")


def test_the_three_files_are_told_apart_and_wrong_combinations_refused_on_the_host(tmp_path):
    from safetensors.torch import save_file

    from parallel_runtime.models.families.sd3.text_file import roles

    reader = family("sd3").text_encoder_file()
    t5, clip_l, clip_g = FILES["t5_fp16"], FILES["clip_l"], FILES["clip_g"]
    assert check_text_encoder_files(reader, clip_g, t5, "sd3", (clip_l,)) == (t5, clip_l, clip_g)
    assert (
        check_text_encoder_files(reader, clip_l, clip_g, "sd3", (FILES["t5_fp8_scaled"],))[0] == FILES["t5_fp8_scaled"]
    )
    assert check_text_encoder_files(reader, clip_g, clip_l, "sd3") == (clip_l, clip_g)  # DualCLIPLoader's two
    assert check_text_encoder_files(reader, clip_l, t5, "sd3") == (t5, clip_l)
    assert check_text_encoder_files(reader, t5, None, "sd3") == (t5,)  # CLIPLoader type sd3: T5 alone, as before
    assert roles([clip_g[0]]) == ["clip_l"]  # a lone CLIP not 1280 wide is CLIP-L ...
    wide = tmp_path / "clip_g.safetensors"
    shapes = {"text_model.embeddings.token_embedding.weight": (8, 1280)}
    save_file({k: torch.zeros(s, dtype=torch.float16) for k, s in shapes.items()}, str(wide))
    assert roles([str(wide), t5[0]]) == ["clip_g", "t5"]  # ... one 1280 wide CLIP-G
    with pytest.raises(
        ConfigError, match=r"not one each of T5-XXL, CLIP-L and CLIP-G .*tiny_sd3_t5_fp16.safetensors: T5-XXL"
    ):
        check_text_encoder_files(reader, t5, FILES["t5_fp8_scaled"], "sd3", (clip_l,))
    with pytest.raises(ConfigError, match="not one each of T5-XXL, CLIP-L and CLIP-G"):
        check_text_encoder_files(reader, clip_l, (clip_l[0], CLIP_TOKENIZER), "sd3", (t5,))  # two CLIPs, one width
    with pytest.raises(ConfigError, match="not one each .*tiny_qwen_image_Q5_1.gguf: none of these"):
        check_text_encoder_files(reader, t5, (str(DATA / "gguf" / "tiny_qwen_image_Q5_1.gguf"), "x"), "sd3")
    with pytest.raises(ConfigError, match=r"four text-encoder files .* for a sd3 model"):
        check_text_encoder_files(reader, t5, clip_l, "sd3", (clip_g, FILES["t5_fp8_scaled"]))
    with pytest.raises(ConfigError, match="is a UMT5 encoder"):
        check_text_encoder_files(reader, (str(DATA / "tiny_umt5_bf16.safetensors"), "x"), clip_l, "sd3")
    with pytest.raises(ConfigError, match="no tokenizer found for tiny_hidream_clip_g"):
        check_text_encoder_files(reader, t5, clip_l, "sd3", ((clip_g[0], None),))
