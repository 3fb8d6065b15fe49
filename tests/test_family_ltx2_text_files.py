"""LTX-2's text encoding from single files (``families.ltx2.text_files``), in process: the tiny Gemma-3 saved as ONE
file under the release's older transformers names (``language_model.model.*``, beside a vision tower, projector and
lm_head that are not read) or today's (``model.language_model.*``), its tokenizer found beside the file, and the tiny
connectors saved under the LTX-2 release checkpoint's names (``text_embedding_projection.aggregate_embed.*``,
``model.diffusion_model.video_embeddings_connector.*`` with ``transformer_1d_blocks``/``q_norm``/``k_norm``, beside an
audio connector that is not read) encode prompts exactly as the diffusers folder does (which equals LTX2Pipeline's
encode_prompt + connectors, test_family_ltx2.py). The Gemma names follow DiffSynth-Studio's converter; the connectors'
inner names follow public ports of the release (diffusers' conversion script was not at hand to confirm them)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.ltx2.text import encode
from parallel_runtime.models.families.ltx2.text_files import (
    gemma3_tokenizer,
    load_gemma3_file,
    load_ltx2_connectors_file,
)
from parallel_runtime.models.loading import load_pipeline_components

POSITIVE, NEGATIVE = "a red fox runs through snow, slow motion", "blurry"
LENGTH = 1024


@pytest.fixture(scope="module")
def comps():
    return load_pipeline_components(ensure_tiny_model("tiny-ltx2"), "cpu", torch.float32)


def _release_connector_name(name: str) -> str:
    """diffusers' connector name -> the release checkpoint's (the inverse of the loader's renames)."""
    name = name.replace("transformer_blocks.", "transformer_1d_blocks.")
    return name.replace(".norm_q.", ".q_norm.").replace(".norm_k.", ".k_norm.")


def _write_files(comps, folder: Path, gemma_names: str) -> tuple[Path, Path]:
    gemma = comps.text_encoders["text_encoder"]
    state = {}
    for name, tensor in gemma.state_dict().items():  # Gemma3ForConditionalGeneration: model.language_model.* ...
        if gemma_names == "release":
            name = name.replace("model.language_model.", "language_model.model.").replace(
                "model.vision_tower.", "vision_tower."
            )
            name = name.replace("model.multi_modal_projector.", "multi_modal_projector.").replace(
                "lm_head.", "language_model.lm_head."
            )
        state[name] = tensor.contiguous().clone()  # fmt: skip
    text_file = folder / "gemma_3_12B_it.safetensors"
    save_file(state, str(text_file))
    shutil.copytree(comps.path / "tokenizer", folder / "tokenizer")
    checkpoint = {"model.diffusion_model.patchify_proj.weight": torch.zeros(4, 4)}  # a transformer's, not read here
    for name, tensor in comps.text_encoders["connectors"].state_dict().items():
        if name.startswith("text_proj_in."):
            name = "text_embedding_projection.aggregate_embed." + name[len("text_proj_in.") :]
        else:
            kind, rest = name.split(".", 1)
            name = f"model.diffusion_model.{kind.split('_')[0]}_embeddings_connector.{_release_connector_name(rest)}"
        checkpoint[name] = tensor.contiguous().clone()
    ckpt_file = folder / "ltx-2-19b-dev.safetensors"
    save_file(checkpoint, str(ckpt_file))
    return text_file, ckpt_file


@pytest.mark.parametrize("gemma_names", ["release", "transformers"])
def test_single_files_encode_as_the_diffusers_folder(comps, tmp_path, gemma_names):
    text_file, ckpt_file = _write_files(comps, tmp_path, gemma_names)
    text_config = comps.text_encoders["text_encoder"].config.text_config.to_dict()
    conn = comps.text_encoders["connectors"].config
    from_files = SimpleNamespace(
        path=tmp_path,
        text_encoders={
            "text_encoder": load_gemma3_file(text_file, dtype=torch.float32, overrides=text_config),
            "connectors": load_ltx2_connectors_file(
                ckpt_file,
                dtype=torch.float32,
                overrides={"video_connector_attention_head_dim": conn.video_connector_attention_head_dim, "rope_type": conn.rope_type},
            ),
        },
        tokenizers={"tokenizer": gemma3_tokenizer(text_file)},
    )  # fmt: skip
    assert not any("audio" in n for n, _ in from_files.text_encoders["connectors"].named_parameters())
    ours = encode(from_files, [NEGATIVE, POSITIVE], LENGTH, torch.device("cpu"))
    theirs = encode(comps, [NEGATIVE, POSITIVE], LENGTH, torch.device("cpu"))
    torch.testing.assert_close(ours.prompt_embeds, theirs.prompt_embeds, atol=1e-6, rtol=0)
    assert torch.equal(ours.attention_mask, theirs.attention_mask)


def test_wrong_files_are_refused_clearly(comps, tmp_path):
    text_file, ckpt_file = _write_files(comps, tmp_path, "release")
    with pytest.raises(ConfigError, match="Gemma-3"):
        load_gemma3_file(ckpt_file)
    with pytest.raises(ConfigError, match="text connectors"):
        load_ltx2_connectors_file(text_file)
    (tmp_path / "tokenizer").rename(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="no Gemma tokenizer"):
        gemma3_tokenizer(text_file)
    assert gemma3_tokenizer(text_file, tmp_path / "elsewhere") is not None
