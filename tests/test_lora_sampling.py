"""Parallel Sampler + LoRA equals ComfyUI's KSampler + LoraLoaderModelOnly, on one rank and every layout.

Oracle 1: KSampler outputs stored by tests/data/make_comfy_lora_reference.py (ComfyUI's own loader, LoRA
code and sampler on the same tiny original-layout files, LoRA files and CONDITIONING; the sigmas KSampler
used are passed as SIGMAS so the comparison does not depend on model-sampling defaults).
Oracle 2: the single-rank run with the same stack equals Ulysses 2, CFG 2 and PipeFusion 2 (warmup = steps).
All on one warm pool per layout: changing the stack between runs never reloads the model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lora_files as lf
import pytest
import torch

from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.lora import LoraSpec

DATA = Path(__file__).parent / "data"
REF = json.loads((DATA / "comfy_lora_reference.json").read_text())
TOLERANCE = 1e-4
WIDTHS = {"flux": (32, 32), "sd3": (96, 80)}  # prompt embedding width, pooled width


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("lora-sampling")
    return {
        family: Path(lf.write_model(REF["models"][family]["skeleton"], str(folder / f"tiny_{family}.safetensors")))
        for family in ("flux", "sd3")
    }


def specs(family: str, case: str) -> list[LoraSpec]:
    return [LoraSpec.of(DATA / "lora" / f"{stem}.safetensors", s, 0.0) for stem, s in REF["cases"][family][case]]


def reference(family: str, case: str) -> torch.Tensor:
    found = REF["sampling"][family]["cases"][case]
    return torch.tensor(found["data"]).reshape(found["shape"])


def sample(model, family: str) -> torch.Tensor:
    width, pooled = WIDTHS[family]
    pos = Conditioning(*lf.conditioning(f"{family}.positive", REF["tokens"], width, pooled))
    neg = Conditioning(*lf.conditioning(f"{family}.negative", REF["tokens"], width, pooled))
    s = REF["sampling"][family]["settings"]
    latent = torch.zeros(REF["latent_shape"])
    side = latent.shape[-1] * 8
    return model.sample(
        pos,
        neg,
        latent,
        side,
        side,
        seed=REF["seed"],
        steps=s["steps"],
        cfg=s["cfg"],
        sampler_name=s["sampler_name"],
        scheduler=s["scheduler"],
        sigmas=torch.tensor(REF["sampling"][family]["sigmas"]),
        guidance=s["guidance"],
    )


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def load(path: Path, registry, devices: str = "cpu:1", layout: ParallelConfig | None = None, **kw):
    request = LoadRequest(model=str(path), devices=devices, layout=layout, dtype="fp32", **kw)
    return load_parallel_model(request, registry)


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_every_format_and_stack_equals_ksampler_on_one_warm_pool(tiny_files, pool_registry, family):
    model = load(tiny_files[family], pool_registry)
    starts = model.pool.starts
    none = reference(family, "none")
    outputs = {}
    for case in REF["sampling"][family]["cases"]:
        expected = reference(family, case)
        if case != "none":
            assert relative(expected, none) > 30 * TOLERANCE, f"{case}: the LoRA barely changes the reference"
        outputs[case] = sample(model.with_loras(*specs(family, case)), family)
        assert relative(outputs[case], expected) <= TOLERANCE, f"{family}/{case}"
    assert model.pool.starts == starts  # swaps and strength changes never restarted or reloaded anything
    assert torch.equal(sample(model, family), outputs["none"])  # back to no LoRA: the same bits


LAYOUTS = [
    ("flux", "cpu:2", ParallelConfig(ulysses=2), {}),
    ("sd3", "cpu:2", ParallelConfig(cfg=2), {}),  # cfg 3: the branches run on different ranks
    ("flux", "cpu:2", ParallelConfig(pp=2), {"pp_warmup": 4, "pp_patches": 2}),
    ("sd3", "cpu:2", ParallelConfig(pp=2), {"pp_warmup": 4, "pp_patches": 2}),
]


@pytest.fixture(scope="module")
def one_rank_stack(tiny_files, pool_registry):
    """family -> the stacked LoRAs sampled on one rank, computed once per family (not once per layout,
    which in turn evicted and reloaded the one-rank pools between the layouts)."""
    found: dict[str, torch.Tensor] = {}

    def get(family: str) -> torch.Tensor:
        if family not in found:
            found[family] = sample(load(tiny_files[family], pool_registry).with_loras(*specs(family, "stack")), family)
        return found[family]

    return get


@pytest.mark.parametrize(
    ("family", "devices", "layout", "extra"), LAYOUTS, ids=[f"{f}-{c.describe()}" for f, _, c, _ in LAYOUTS]
)
def test_stacked_loras_on_every_layout_equal_one_rank(
    tiny_files, pool_registry, one_rank_stack, family, devices, layout, extra
):
    single = one_rank_stack(family)
    many = load(tiny_files[family], pool_registry, devices, layout, **extra).with_loras(*specs(family, "stack"))
    parallel = sample(many, family)
    assert relative(parallel, single) <= 1e-5
    assert relative(parallel, reference(family, "stack")) <= TOLERANCE


@pytest.fixture(scope="module")
def flux_folder(tiny_files, tmp_path_factory) -> Path:
    """A diffusers folder (tiny-flux's text encoders, VAE, tokenizers) holding the tiny original file's weights."""
    from dit_devtools.tiny import ensure_tiny_model
    from parallel_runtime.models.single_file import load_single_file_transformer

    folder = tmp_path_factory.mktemp("lora-folder") / "flux"
    shutil.copytree(ensure_tiny_model("tiny-flux"), folder)
    transformer, _, _ = load_single_file_transformer(tiny_files["flux"])
    shutil.rmtree(folder / "transformer")
    transformer.save_pretrained(folder / "transformer", safe_serialization=True)
    return folder


def test_original_layout_loras_on_a_diffusers_folder_equal_ksampler(flux_folder, pool_registry):
    """kohya / LoKr / DoRA names of the original layout, routed through the skeleton computed from the
    folder's config (no file header to read them from)."""
    model = load(flux_folder, pool_registry)
    for case in ("stack", "lokr", "dora"):
        out = sample(model.with_loras(*specs("flux", case)), "flux")
        assert relative(out, reference("flux", case)) <= TOLERANCE, case


def test_text_encoder_strength_applies_on_the_workers(flux_folder, pool_registry):
    """strength_clip patches the pipeline's own text encoders (Parallel Text Encode) like the same patch
    applied in-process; strength_clip 0 leaves them alone."""
    from parallel_runtime.models.loading import load_pipeline_components
    from parallel_runtime.models.lora.keymap import TRANSFORMER
    from parallel_runtime.models.lora.model_keys import model_keys
    from parallel_runtime.models.lora.patcher import LoraPatcher
    from parallel_runtime.models.text_encoding import encode_prompt
    from parallel_runtime.service.lora import stack_entries

    model = load(flux_folder, pool_registry)
    spec = LoraSpec.of(DATA / "lora" / "flux_kohya.safetensors", 0.5, 1.5)
    prompt = "a photo of a cat"
    plain = model.encode_text(prompt)
    patched = model.with_loras(spec).encode_text(prompt)
    model_only = model.with_loras(LoraSpec.of(spec.path, 1.0, 0.0)).encode_text(prompt)
    comps = load_pipeline_components(flux_folder, "cpu", torch.float32, ("text",))
    keys = model_keys("flux", None, {}, encoders=comps.text_encoders)
    LoraPatcher(keys, comps.text_encoders).apply(stack_entries([spec]), list(comps.text_encoders))
    with torch.no_grad():
        expected = encode_prompt(comps, "flux", prompt, None)
    assert TRANSFORMER not in keys.encoders
    assert not torch.equal(patched.pooled, plain.pooled)  # the kohya file patches CLIP-L layers 0 and 1
    assert torch.equal(patched.pooled, expected.pooled.float())
    assert torch.equal(patched.prompt_embeds, expected.prompt_embeds.float())
    assert torch.equal(model_only.pooled, plain.pooled)
    assert torch.equal(model.encode_text(prompt).pooled, plain.pooled)  # unpatched again, bit for bit
