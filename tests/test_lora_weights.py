"""LoRA patches equal ComfyUI's, weight for weight; strength changes, swaps and unpatching are exact.

Oracle: tests/data/comfy_lora_reference.json, written by ComfyUI's own LoRA code
(tests/data/make_comfy_lora_reference.py) on the same tiny original-layout Flux / SD3 files and the
LoRA files in tests/data/lora (kohya, ComfyUI, PEFT, AI-Toolkit, OneTrainer, XLabs, LoKr, LoHa, full diff,
DoRA; single and stacked). These tests patch in-process, without workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path

import lora_files as lf
import pytest
import torch

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.lora.files import lora_file_id, read_lora
from parallel_runtime.models.lora.keymap import TRANSFORMER
from parallel_runtime.models.lora.model_keys import model_keys
from parallel_runtime.models.lora.patcher import LoraPatcher, StackEntry
from parallel_runtime.models.lora.resolve import check_resolution, resolve
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer

DATA = Path(__file__).parent / "data"
REF = json.loads((DATA / "comfy_lora_reference.json").read_text())
FAMILIES = ("flux", "sd3")


def lora(stem: str):
    return lora_file_id(DATA / "lora" / f"{stem}.safetensors")


def stack_of(family: str, case: str, clip: float = 0.0) -> list[StackEntry]:
    return [StackEntry(lora(stem), strength, clip) for stem, strength in REF["cases"][family][case]]


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    """The tiny original-layout transformers ComfyUI patched (checked byte for byte)."""
    folder = tmp_path_factory.mktemp("lora-models")
    out = {}
    for family in FAMILIES:
        path = folder / f"tiny_{family}_original.safetensors"
        lf.write_model(REF["models"][family]["skeleton"], str(path))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == REF["models"][family]["sha256"]
        out[family] = path
    return out


def load(path: Path, dtype: torch.dtype = torch.float32):
    """(transformer, key table, patcher) of a single-file model, keyed by its own header."""
    model, family, _ = load_single_file_transformer(path, "cpu", dtype)
    info = inspect_single_file(path)
    skeleton = {k: tuple(v) for k, v in REF["models"][family]["skeleton"].items()}
    keys = model_keys(family, model, info.config, original=skeleton)
    return model, keys, LoraPatcher(keys, {TRANSFORMER: model})


@pytest.fixture(scope="module")
def loaded(tiny_files):
    return {family: load(tiny_files[family]) for family in FAMILIES}


def original_tensor(model, keys, name: str) -> torch.Tensor:
    """An original-layout tensor put together from the diffusers model's rows."""
    route = keys.routing.routes[name]
    params = dict(model.named_parameters())
    first = params[route.pieces[0].param]
    out = torch.empty((route.rows, *first.shape[1:]), dtype=first.dtype)
    for piece in route.pieces:
        out[piece.index()] = params[piece.param].detach()
    return out


def checksums(t: torch.Tensor) -> dict:
    flat = t.detach().double().flatten()
    weights = lf.uniform("checksum", (flat.numel(),)).double()
    return {"sum": float(flat.sum()), "wsum": float((flat * weights).sum()), "sumsq": float((flat * flat).sum())}


def assert_matches(got: torch.Tensor, expected: dict, label: str) -> None:
    assert list(got.shape) == expected["shape"], label
    scale = math.sqrt(expected["sumsq"] * got.numel()) + 1e-12
    values = checksums(got)
    for key in ("sum", "wsum", "sumsq"):
        assert abs(values[key] - expected[key]) <= 1e-6 * scale, f"{label}: {key} {values[key]} != {expected[key]}"
    head = got.detach().double().flatten()[:8]
    assert torch.allclose(head, torch.tensor(expected["head"], dtype=torch.float64), rtol=0, atol=1e-6), label


CASES = [(family, case) for family in FAMILIES for case in REF["patched"][family]]


@pytest.mark.parametrize(("family", "case"), CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_patched_weights_equal_comfyui(loaded, tiny_files, family, case):
    model, keys, patcher = loaded[family]
    patcher.apply(stack_of(family, case), [TRANSFORMER])
    expected = REF["patched"][family][case]["weights"]
    pristine = load_single_file_transformer(tiny_files[family])[0]
    changed = set()
    for name in keys.routing.routes:
        if name not in keys.original:
            continue
        now = original_tensor(model, keys, name)
        if not torch.equal(now, original_tensor(pristine, keys, name)):
            changed.add(name)
    assert changed == set(expected), f"patched {sorted(changed ^ set(expected))} differently from ComfyUI"
    for name, stats in expected.items():
        assert_matches(original_tensor(model, keys, name), stats, f"{family}/{case}/{name}")


def text_encoders(family: str) -> dict[str, torch.nn.Module]:
    """Tiny text encoders with values set by ComfyUI's names for them (as in the reference)."""
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from parallel_runtime.models.families.registry import family as family_spec
    from parallel_runtime.models.lora.keymap import canonical_encoder_name

    out = {}
    for component, role in family_spec(family).text.lora_roles.items():
        kind, width, layers = lf.TEXT_ENCODERS[family][role]
        if kind == "clip":
            config = CLIPTextConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                                    num_attention_heads=4, vocab_size=64, max_position_embeddings=77)  # fmt: skip
            module = CLIPTextModel(config)  # names without text_model. in transformers 5
        else:
            config = T5Config(vocab_size=64, d_model=width, d_kv=8, d_ff=2 * width, num_layers=layers, num_heads=4,
                              feed_forward_proj="gated-gelu", relative_attention_num_buckets=8)  # fmt: skip
            module = T5EncoderModel(config)
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.copy_(lf.base_value(f"{role}.transformer.{canonical_encoder_name(name, kind)}", tuple(p.shape)))
        out[component] = module.eval().requires_grad_(False)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_text_encoder_patches_equal_comfyui(family):
    reference = REF["text_encoders"][family]
    encoders = text_encoders(family)
    keys = model_keys(family, None, {}, encoders=encoders)
    patcher = LoraPatcher(keys, encoders)
    stack = [StackEntry(lora(stem), 0.0, strength) for stem, strength in reference["case"]]
    patcher.apply(stack, list(encoders))
    by_comfy_name = {}
    for component, enc in keys.encoders.items():
        params = dict(encoders[component].named_parameters())
        for canonical, (name, _) in enc.tensors.items():
            by_comfy_name[f"{enc.role}.transformer.{canonical}"] = params[name]
    for name, stats in reference["patched"].items():
        assert_matches(by_comfy_name[name], stats, f"{family}/{name}")
    for stem, matched in reference["matched"].items():
        resolution = patcher.resolution(lora(stem))
        assert sum(resolution.text_modules.values()) == len(matched), stem


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_same_bits(model, expected: dict[str, torch.Tensor]) -> None:
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), expected[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strength_changes_swaps_and_unpatching_are_bit_exact(tiny_files, dtype):
    model, _, patcher = load(tiny_files["flux"], dtype)
    pristine = snapshot(model)
    stack = [StackEntry(lora("flux_kohya"), 0.8), StackEntry(lora("flux_peft"), -0.6)]
    patcher.apply(stack, [TRANSFORMER])
    patched = snapshot(model)
    assert any(not torch.equal(patched[k], pristine[k]) for k in pristine)
    patcher.apply([StackEntry(lora("flux_kohya"), 0.3), StackEntry(lora("flux_peft"), -0.6)], [TRANSFORMER])
    patcher.apply([StackEntry(lora("flux_dora"), 1.0), StackEntry(lora("flux_lokr"), 0.5)], [TRANSFORMER])
    patcher.apply(stack, [TRANSFORMER])
    assert_same_bits(model, patched)
    patcher.apply([StackEntry(lora("flux_kohya"), 0.0), StackEntry(lora("flux_diff"), 0.0)], [TRANSFORMER])
    assert_same_bits(model, pristine)  # strength 0 is no LoRA at all
    patcher.apply(stack, [TRANSFORMER])
    patcher.apply([], [TRANSFORMER])
    assert_same_bits(model, pristine)


def test_patch_math_runs_in_fp32_and_is_stored_in_the_model_dtype(tiny_files):
    """A bf16 model patched equals the fp32 patch of its bf16 weights, rounded once to bf16 (ComfyUI's way)."""
    low, _, low_patcher = load(tiny_files["flux"], torch.bfloat16)
    high, _, high_patcher = load(tiny_files["flux"], torch.float32)
    with torch.no_grad():
        for (_, p32), (_, p16) in zip(high.named_parameters(), low.named_parameters()):
            p32.copy_(p16.float())
    stack = [StackEntry(lora("flux_kohya"), 0.8), StackEntry(lora("flux_loha"), 1.2)]
    low_patcher.apply(stack, [TRANSFORMER])
    high_patcher.apply(stack, [TRANSFORMER])
    for (name, p32), (_, p16) in zip(high.named_parameters(), low.named_parameters()):
        assert torch.equal(p32.to(torch.bfloat16), p16), name


def test_a_rank_patches_only_the_weights_it_holds(tiny_files):
    """PipeFusion: parameters of other stages are on "meta"; the held ones get exactly the full patch."""
    full, _, full_patcher = load(tiny_files["flux"])
    part, _, _ = load(tiny_files["flux"])
    part.transformer_blocks[1].to("meta")
    part.single_transformer_blocks.to("meta")
    _, keys, _ = load(tiny_files["flux"])
    stage_patcher = LoraPatcher(keys, {TRANSFORMER: part})
    stack = stack_of("flux", "stack")
    counts = stage_patcher.apply(stack, [TRANSFORMER])
    full_counts = full_patcher.apply(stack, [TRANSFORMER])
    assert 0 < counts["recomputed"] < full_counts["recomputed"]
    full_params = dict(full.named_parameters())
    for name, p in part.named_parameters():
        if p.device.type != "meta":
            assert torch.equal(p, full_params[name]), name


def test_another_familys_lora_is_rejected_with_counts(loaded):
    _, flux_keys, _ = loaded["flux"]
    _, sd3_keys, _ = loaded["sd3"]
    sd3_on_flux = resolve(read_lora(lora("sd3_kohya")), flux_keys)
    with pytest.raises(
        ConfigError, match=r"matches 0 of its 9 diffusion-model modules to this flux model.*look like a sd3 LoRA"
    ):
        check_resolution(sd3_on_flux, flux_keys, "sd3_kohya.safetensors", text_on_workers=False)
    flux_on_sd3 = resolve(read_lora(lora("flux_peft")), sd3_keys)
    assert flux_on_sd3.wrong_shape  # same diffusers names, other widths
    with pytest.raises(ConfigError, match=r"other shapes"):
        check_resolution(flux_on_sd3, sd3_keys, "flux_peft.safetensors", text_on_workers=False)


def test_partial_matches_are_logged_with_counts(loaded, caplog):
    _, keys, _ = loaded["flux"]
    resolution = resolve(read_lora(lora("flux_kohya")), keys)
    with caplog.at_level(logging.WARNING):
        check_resolution(resolution, keys, "flux_kohya.safetensors", text_on_workers=False)
    assert "8 of 10 modules patch the transformer" in caplog.text
    assert "2 unmatched" in caplog.text


def test_unreadable_and_unsupported_files_are_clear_errors(tmp_path, loaded):
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="could not be read as a safetensors file"):
        read_lora(lora_file_id(bad))
    (tmp_path / "old.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="not a .safetensors file"):
        lora_file_id(tmp_path / "old.pt")
    from safetensors.torch import save_file

    oft = tmp_path / "oft.safetensors"
    save_file({"lora_unet_double_blocks_0_img_attn_proj.oft_blocks": torch.zeros(4, 16, 16)}, str(oft))
    _, keys, _ = loaded["flux"]
    with pytest.raises(ConfigError, match="OFT"):
        check_resolution(resolve(read_lora(lora_file_id(oft)), keys), keys, oft.name, text_on_workers=False)


def test_routing_is_the_conversion_plan_inverted():
    """A fused tensor split in three and a modulation with swapped halves route back row by row; a diffusers
    tensor made of two original tensors cannot be routed."""
    from parallel_runtime.models.conversion_plan import plan_conversion
    from parallel_runtime.models.lora.routing import routing_of_plan

    def convert(sd):
        qkv, mod = sd.pop("qkv.weight"), sd.pop("mod.weight")
        return {
            "q.weight": qkv[:2],
            "k.weight": qkv[2:4],
            "v.weight": qkv[4:],
            "mod.weight": torch.cat([mod[2:], mod[:2]]),
        }

    shapes = {"qkv.weight": (6, 3), "mod.weight": (4, 3)}
    routing = routing_of_plan(plan_conversion(convert, shapes), shapes)
    qkv = routing.routes["qkv.weight"]
    assert qkv.rows == 6 and [(p.param, p.segments) for p in qkv.pieces] == [
        ("q.weight", ((0, 2),)),
        ("k.weight", ((2, 4),)),
        ("v.weight", ((4, 6),)),
    ]
    assert routing.routes["mod.weight"].piece("mod.weight").segments == ((2, 4), (0, 2))
    assert routing.group_of("k.weight") is qkv
    mixed = plan_conversion(lambda sd: {"both.weight": torch.cat([sd["qkv.weight"], sd["mod.weight"]])}, shapes)
    with pytest.raises(ConfigError, match="both.weight mixes rows of several original tensors"):
        routing_of_plan(mixed, shapes)
