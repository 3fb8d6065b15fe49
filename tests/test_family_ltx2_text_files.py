"""LTX-2's text encoding from single files (``families.ltx2.text_files``), in process: the tiny Gemma-3 saved as ONE
file under the release's older transformers names (``language_model.model.*``, beside a vision tower, projector and
lm_head that are not read) or today's (``model.language_model.*``), its tokenizer found beside the file, and the tiny
connectors saved under the LTX-2 release checkpoint's names (``text_embedding_projection.aggregate_embed.*``,
``model.diffusion_model.video_embeddings_connector.*`` with ``transformer_1d_blocks``/``q_norm``/``k_norm``, beside an
audio connector that is not read) encode prompts exactly as the diffusers folder does (which equals LTX2Pipeline's
encode_prompt + connectors, test_family_ltx2.py). The Gemma names follow DiffSynth-Studio's converter; the connectors'
renames are those of diffusers' scripts/convert_ltx2_to_diffusers.py. Then Parallel Text Encode's path on the workers
(1 rank, Ulysses 2): the Gemma file with the connectors of the LOADED model's own file (a tiny release checkpoint), of
a connectors file given beside it, or of the loaded diffusers folder; the host's refusals."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

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


# -- Parallel Text Encode on the workers: the Gemma file + the connectors of the LOADED model's own checkpoint ------
PROMPTS = [POSITIVE, NEGATIVE]


@pytest.fixture(scope="module")
def release(comps, tmp_path_factory):
    """The Gemma file (release names, its tokenizer beside it) and a tiny LTX-2 checkpoint the workers load: the
    transformer in Lightricks' names under ``model.diffusion_model.`` (with its config in the metadata, as
    test_family_ltx2_files writes it) and the text connectors where the release keeps them; the overrides that give
    the loaders the tiny sizes the weights do not show."""
    import json

    from test_family_ltx2_files import PREFIX, original_name  # tests/ module: the release names of the transformer

    folder = tmp_path_factory.mktemp("ltx2-text-node")
    text_file, connectors_only = _write_files(comps, folder, "release")
    transformer = load_pipeline_components(comps.path, "cpu", torch.float32, parts=("transformer",)).transformer
    state = {PREFIX + original_name(k): v.contiguous() for k, v in transformer.state_dict().items()}
    state |= {k: v for k, v in load_file(str(connectors_only)).items() if "connector" in k or "text_embedding" in k}
    c = transformer.config
    stated = {k: c[k] for k in ("num_attention_heads", "attention_head_dim", "audio_num_attention_heads",
                                "audio_attention_head_dim")}  # fmt: skip
    stated.update(rope_type="split", frequencies_precision="float64")
    checkpoint = folder / "ltx-2-tiny.safetensors"
    save_file(state, str(checkpoint), metadata={"config": json.dumps({"transformer": stated})})
    bare = {k: v for k, v in state.items() if "connector" not in k and not k.startswith("text_embedding")}
    transformer_only = folder / "ltx-2-tiny-transformer-only.safetensors"
    save_file(bare, str(transformer_only), metadata={"config": json.dumps({"transformer": stated})})
    separate = folder / "ltx-2-tiny-connectors.safetensors"  # a connectors file: bare names, as diffusers' converter
    save_file({k.removeprefix(PREFIX): v for k, v in state.items() if k not in bare}, str(separate))  # reads them
    conn = comps.text_encoders["connectors"].config
    overrides = {
        **comps.text_encoders["text_encoder"].config.text_config.to_dict(),
        "connectors": {"video_connector_attention_head_dim": conn.video_connector_attention_head_dim, "rope_type": conn.rope_type},
    }  # fmt: skip
    paths = SimpleNamespace(
        gemma=str(text_file), checkpoint=str(checkpoint), transformer_only=str(transformer_only),
        connectors=str(separate), folder=str(comps.path),
    )  # fmt: skip
    return paths, overrides


@pytest.fixture(scope="module")
def oracle(comps):
    """The diffusers-folder path's conditioning of PROMPTS (in process), checked against LTX2Pipeline's encode_prompt
    + connectors."""
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(comps.path, torch_dtype=torch.float32, audio_vae=None, vocoder=None)
    out = [encode(comps, [p], LENGTH, torch.device("cpu")) for p in PROMPTS]
    with torch.no_grad():
        embeds, mask, _, _ = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False, device="cpu")
        video, _audio, video_mask = pipe.connectors(embeds, mask, padding_side="left")
    for i, cond in enumerate(out):
        torch.testing.assert_close(cond.prompt_embeds, video[i : i + 1], atol=1e-5, rtol=0)
        assert torch.equal(cond.attention_mask, video_mask[i : i + 1])
    return out


def _encode_on_workers(pool, files, overrides):
    from parallel_runtime.service.model_jobs import encode_text_file

    (gemma, tokenizer), *more = files
    return pool.submit(encode_text_file, gemma, tokenizer, PROMPTS, None, overrides, more=tuple(more)).result(300)


@pytest.mark.parametrize("layout", ["one rank", "ulysses2"])
def test_workers_encode_from_the_gemma_file_and_the_loaded_checkpoint(cpu_pool, release, oracle, layout):
    """Parallel Text Encode's path with a Gemma file: the host finds the connectors in the loaded model's file
    (the checkpoint), or takes a connectors file given beside the Gemma file, or the loaded diffusers folder's; the
    workers encode exactly as the diffusers folder does (= LTX2Pipeline's encode_prompt + connectors)."""
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.host_checks import text_encoder_files
    from parallel_runtime.service.load_job import load_model

    paths, overrides = release
    pool = cpu_pool(ParallelConfig(ulysses=2) if layout == "ulysses2" else ParallelConfig())
    sources = [(paths.checkpoint, None, paths.checkpoint)]  # (loaded model, text_encoder_2, the part's source)
    if layout == "ulysses2":
        sources += [(paths.transformer_only, paths.connectors, paths.connectors), (paths.folder, None, paths.folder)]
    for loaded, second, source in sources:
        pool.submit(load_model, loaded, "fp32", "sdpa").result(300)
        given = None if second is None else (second, None)
        files = text_encoder_files("ltx2", (paths.gemma, None), given, model_file=loaded)
        assert files == ((paths.gemma, None), (source, None))
        got = _encode_on_workers(pool, files, overrides)
        for cond, ref in zip(got, oracle):
            torch.testing.assert_close(cond.prompt_embeds, ref.prompt_embeds, atol=1e-5, rtol=0)
            assert torch.equal(cond.attention_mask, ref.attention_mask)


def test_the_host_refuses_missing_or_wrong_files_clearly(release):
    from parallel_runtime.service.host_checks import text_encoder_files

    paths, _ = release
    t5 = str(Path(__file__).parent / "data" / "tiny_clip_l.safetensors")
    with pytest.raises(ConfigError, match="holds no LTX-2 text connectors, and no file of them") as info:
        text_encoder_files("ltx2", (paths.gemma, None), None, model_file=paths.transformer_only)
    assert "give a file holding the LTX-2 text connectors as text_encoder_2" in str(info.value)
    with pytest.raises(ConfigError, match="does not hold a Gemma-3 text model"):
        text_encoder_files("ltx2", (t5, None), None, model_file=paths.checkpoint)
    with pytest.raises(ConfigError, match="files holding the LTX-2 text connectors"):  # the checkpoint as the Gemma
        text_encoder_files("ltx2", (paths.checkpoint, None), None, model_file=paths.checkpoint)
    with pytest.raises(ConfigError, match="not a safetensors file of Gemma-3"):
        text_encoder_files("ltx2", (paths.gemma.replace(".safetensors", ".gguf"), None), None, model_file=paths.folder)


def _sentencepiece_model() -> bytes:
    """A tiny SentencePiece model (Gemma's special ids: pad 0, eos 1, bos 2, unk 3), trained here."""
    import io

    import sentencepiece

    text = [POSITIVE, NEGATIVE, "the quick brown fox jumps over the lazy dog"] * 20
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=out, vocab_size=60, model_type="bpe", pad_id=0, eos_id=1,
        bos_id=2, unk_id=3, character_coverage=1.0, minloglevel=2,
    )  # fmt: skip
    return out.getvalue()


def test_the_gemma_files_own_tokenizer_is_read_as_comfyui_reads_it(comps, cpu_pool, release, tmp_path):
    """ComfyUI's Gemma-3 files carry their SentencePiece model as the uint8 tensor ``spiece_model``: it is the
    tokenizer (before any folder beside the file), its ids equal SentencePiece's own with a beginning token and no end
    token (ComfyUI's Gemma-3 tokenizer settings), left-padded with the pad id; the workers encode with it."""
    import sentencepiece

    from parallel_runtime.models.families.ltx2.gemma_tokenizer import SentencePieceGemmaTokenizer
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.load_job import load_model

    paths, overrides = release
    proto = _sentencepiece_model()
    state = load_file(paths.gemma) | {"spiece_model": torch.frombuffer(bytearray(proto), dtype=torch.uint8)}
    gemma = tmp_path / "gemma_3_12B_it_fp8.safetensors"
    save_file(state, str(gemma))
    shutil.copytree(comps.path / "tokenizer", tmp_path / "tokenizer")  # a folder beside it is not taken
    tokenizer = gemma3_tokenizer(gemma, tmp_path / "tokenizer")
    assert isinstance(tokenizer, SentencePieceGemmaTokenizer)
    tokenizer.padding_side = "left"
    got = tokenizer([POSITIVE, NEGATIVE, POSITIVE * 3], padding="max_length", max_length=24, truncation=True)
    theirs = sentencepiece.SentencePieceProcessor(model_proto=proto, add_bos=True, add_eos=False)
    for row, mask, prompt in zip(
        got.input_ids.tolist(), got.attention_mask.tolist(), [POSITIVE, NEGATIVE, POSITIVE * 3]
    ):
        ids = theirs.encode(prompt)[:24]
        assert row == [0] * (24 - len(ids)) + ids and mask == [0] * (24 - len(ids)) + [1] * len(ids)
    assert len(theirs.encode(POSITIVE * 3)) > 24  # the third is truncated
    pool = cpu_pool(ParallelConfig())
    pool.submit(load_model, paths.checkpoint, "fp32", "sdpa").result(300)
    files = ((str(gemma), None), (paths.checkpoint, None))
    on_workers = _encode_on_workers(pool, files, overrides)
    sp = SentencePieceGemmaTokenizer(proto, gemma.name)
    in_process = SimpleNamespace(path=tmp_path, text_encoders=comps.text_encoders, tokenizers={"tokenizer": sp})
    for cond, prompt in zip(on_workers, PROMPTS):
        ref = encode(in_process, [prompt], LENGTH, torch.device("cpu"))
        torch.testing.assert_close(cond.prompt_embeds, ref.prompt_embeds, atol=1e-5, rtol=0)
        assert torch.equal(cond.attention_mask, ref.attention_mask)


@pytest.mark.parametrize("kind", ["scaled", "comfy_quant"])
def test_fp8_gemma_file_keeps_fp8_layers_and_computes_as_its_upcast_weights(comps, tmp_path, kind):
    """ComfyUI's fp8 Gemma files (gemma_3_12B_it_fp8_scaled: the scaled_fp8 marker, or per-layer comfy_quant): the
    decoder layers' Linears stay fp8 with their scales and encode as the same file loaded upcast, not as the full
    precision weights."""
    from bigmodel_files import to_fp8  # tests/ helper

    from parallel_runtime.models.fp8 import fp8_layers

    text_file, _ = _write_files(comps, tmp_path, "release")
    state = load_file(str(text_file))
    layers = {k: v for k, v in state.items() if k.startswith("language_model.model.layers.")}
    path = tmp_path / "gemma_3_12B_it_fp8_scaled.safetensors"
    save_file(to_fp8(layers, kind) | {k: v for k, v in state.items() if k not in layers}, str(path))
    overrides = comps.text_encoders["text_encoder"].config.text_config.to_dict()
    kept = load_gemma3_file(path, dtype=torch.float32, overrides=overrides)
    upcast = load_gemma3_file(path, dtype=torch.float32, overrides=overrides, storage="compute")
    assert "layers.0.self_attn.q_proj" in fp8_layers(kept) and not fp8_layers(upcast)

    def encoded(gemma):
        parts = {"text_encoder": gemma, "connectors": comps.text_encoders["connectors"]}
        files = SimpleNamespace(path=tmp_path, text_encoders=parts, tokenizers=comps.tokenizers)
        return encode(files, [POSITIVE], LENGTH, torch.device("cpu")).prompt_embeds

    got = encoded(kept)
    torch.testing.assert_close(got, encoded(upcast), atol=1e-5, rtol=0)
    assert (got - encode(comps, [POSITIVE], LENGTH, torch.device("cpu")).prompt_embeds).abs().max() > 1e-4
