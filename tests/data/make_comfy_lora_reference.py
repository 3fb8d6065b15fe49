"""Regenerate tests/data/comfy_lora_reference.json (and tests/data/lora/*.safetensors) with ComfyUI's
OWN LoRA code.

Run by hand (not in CI) with a Python that imports ComfyUI (e.g. /work/comfy-venv):

    /work/comfy-venv/bin/python tests/data/make_comfy_lora_reference.py /path/to/ComfyUI --commit <hash>

What it does, with ComfyUI's real code only (nothing from parallel_runtime is imported):
- builds tiny Flux and SD3 transformers in the ORIGINAL layout (ComfyUI's own model classes list the
  tensor names and shapes; values come from tests/lora_files.py) and saves them as single files;
- writes the LoRA files of every format (tests/lora_files.py) to tests/data/lora/;
- loads each model with UNETLoader (for Flux, ComfyUI's detection hard-codes FLUX.1's width, so the
  detected config is corrected to the tiny widths read from the weights), chains
  LoraLoaderModelOnly for each case (one LoRA, or two stacked with different strengths) and records
  the patched weights (checksums and a slice of every patched tensor) and KSampler's output on fixed
  CONDITIONING, with the sigmas KSampler used;
- patches tiny text encoders' weights with ComfyUI's CLIP key map and calculate_weight (strength_clip);
- records how many LoRA modules ComfyUI matched per file and model (also across families).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import lora_files as lf  # noqa: E402  (tests/lora_files.py: torch + safetensors only)
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402 (the sibling helper, found through this folder)

LORA_DIR = HERE / "lora"
LORA_DTYPE = torch.bfloat16  # how most published Flux / SD3 LoRAs are stored (alpha stays fp32)
SEED = 42
LATENT_SHAPE = (1, 16, 8, 8)  # 64 x 64 pixels
TOKENS = 8
SAMPLING = {
    "flux": {"steps": 4, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "guidance": 3.5},
    "sd3": {"steps": 4, "cfg": 3.0, "sampler_name": "dpmpp_2m", "scheduler": "sgm_uniform", "guidance": None},
}
# Cases: (lora file stem, strength) applied in order, as chained LoraLoaderModelOnly nodes.
CASES = {
    "flux": {
        "none": [],
        "kohya": [("flux_kohya", 0.8)],
        "stack": [("flux_kohya", 0.8), ("flux_peft", -0.6)],
        "comfy": [("flux_comfy", 1.0)],
        "peft": [("flux_peft", 1.0)],
        "aitoolkit": [("flux_aitoolkit", 0.7)],
        "onetrainer": [("flux_onetrainer", 1.0)],
        "xlabs": [("flux_xlabs", 0.9)],
        "lokr": [("flux_lokr", 1.0)],
        "loha": [("flux_loha", 1.2)],
        "diff": [("flux_diff", 1.0)],
        "dora": [("flux_dora", 0.75)],
        "dora_stack": [("flux_kohya", 0.5), ("flux_dora", 1.0)],
    },
    "sd3": {
        "none": [],
        "kohya": [("sd3_kohya", 0.8)],
        "stack": [("sd3_kohya", 0.8), ("sd3_peft", -0.6)],
        "peft": [("sd3_peft", 1.0)],
        "comfy": [("sd3_comfy", 1.0)],
        "onetrainer": [("sd3_onetrainer", 1.0)],
        "lokr": [("sd3_lokr", 1.0)],
        "loha": [("sd3_loha", 1.0)],
        "diff": [("sd3_diff", 1.0)],
    },
}
TEXT_CASES = {
    "flux": [("flux_kohya", 0.7), ("flux_peft", 1.3)],
    "sd3": [("sd3_kohya", 0.7), ("sd3_peft", 1.3)],
}


def import_comfy(comfy_dir: Path, base: Path) -> SimpleNamespace:
    stubbed = prepare_comfy(comfy_dir, base)
    import comfy.ldm.flux.model
    import comfy.ldm.modules.diffusionmodules.mmdit
    import comfy.lora
    import comfy.lora_convert
    import comfy.model_detection
    import comfy.model_management
    import comfy.ops
    import comfy.samplers
    import comfy.sd
    import comfy.utils
    import folder_paths

    import nodes

    return SimpleNamespace(comfy=comfy, folder_paths=folder_paths, nodes=nodes, stubbed=stubbed)


# -- values and checksums ----------------------------------------------------------------------------
def stats(t: torch.Tensor) -> dict:
    """Checksums of a tensor that catch changed, missing and permuted values."""
    flat = t.detach().double().flatten()
    weights = lf.uniform("checksum", (flat.numel(),)).double()
    return {
        "shape": list(t.shape),
        "sum": float(flat.sum()),
        "wsum": float((flat * weights).sum()),
        "sumsq": float((flat * flat).sum()),
        "head": [float(f"{v:.9g}") for v in flat[:8].tolist()],
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- models ------------------------------------------------------------------------------------------
def skeletons(c: SimpleNamespace) -> dict[str, dict[str, list[int]]]:
    """Tensor names and shapes of the tiny models, as ComfyUI's own model classes define them."""
    ops = c.comfy.ops.disable_weight_init
    fc = {k: v for k, v in lf.FLUX_CONFIG.items() if k != "image_model"}
    flux = c.comfy.ldm.flux.model.Flux(**fc, dtype=torch.float32, device="meta", operations=ops)
    s = lf.SD3_CONFIG
    hidden = 64 * s["depth"]
    sd3 = c.comfy.ldm.modules.diffusionmodules.mmdit.MMDiT(
        input_size=None,
        patch_size=s["patch_size"],
        in_channels=s["in_channels"],
        out_channels=s["out_channels"],
        depth=s["depth"],
        adm_in_channels=s["adm_in_channels"],
        context_embedder_config={
            "target": "torch.nn.Linear",
            "params": {"in_features": s["context_in_dim"], "out_features": hidden},
        },
        pos_embed_max_size=s["pos_embed_max_size"],
        num_patches=s["pos_embed_max_size"] ** 2,
        qk_norm=s["qk_norm"],
        x_block_self_attn_layers=s["x_block_self_attn_layers"],
        pos_embed_scaling_factor=None,
        dtype=torch.float32,
        device="meta",
        operations=ops,
    )
    return {
        name: {k: list(v.shape) for k, v in model.state_dict().items()}
        for name, model in (("flux", flux), ("sd3", sd3))
    }


def tiny_flux_detection(c: SimpleNamespace):
    """ComfyUI's Flux detection fixes FLUX.1's widths (hidden 3072, 24 heads, T5 4096, rope 16/56/56);
    read the tiny widths from the weights instead (everything else is ComfyUI's own detection)."""
    original = c.comfy.model_detection.detect_unet_config

    def detect(state_dict, key_prefix, metadata=None):
        config = original(state_dict, key_prefix, metadata)
        if isinstance(config, dict) and config.get("image_model") == "flux":
            hidden = state_dict[f"{key_prefix}img_in.weight"].shape[0]
            head = state_dict[f"{key_prefix}double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
            config.update(
                hidden_size=hidden,
                num_heads=hidden // head,
                context_in_dim=state_dict[f"{key_prefix}txt_in.weight"].shape[1],
                axes_dim=list(lf.FLUX_CONFIG["axes_dim"]),
            )
        return config

    return mock.patch.object(c.comfy.model_detection, "detect_unet_config", detect)


def load_model(c: SimpleNamespace, family: str, file_name: str):
    with tiny_flux_detection(c):
        (model,) = c.nodes.UNETLoader().load_unet(file_name, "default")
    dtype = model.model.get_dtype()
    if dtype != torch.float32:
        raise SystemExit(f"ComfyUI loaded the tiny {family} model in {dtype}; the references need fp32")
    return model


def conditioning(family: str, name: str) -> list:
    width = lf.FLUX_CONFIG["context_in_dim"] if family == "flux" else lf.SD3_CONFIG["context_in_dim"]
    pooled = lf.FLUX_CONFIG["vec_in_dim"] if family == "flux" else lf.SD3_CONFIG["adm_in_channels"]
    cond, pooled_t = lf.conditioning(f"{family}.{name}", TOKENS, width, pooled)
    extra = {"pooled_output": pooled_t}
    if SAMPLING[family]["guidance"] is not None:
        extra["guidance"] = SAMPLING[family]["guidance"]
    return [[cond, extra]]


class _NotLoaded(logging.Handler):
    def __init__(self):
        super().__init__()
        self.keys: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("lora key not loaded: "):
            self.keys.append(message[len("lora key not loaded: ") :])


def apply_case(c: SimpleNamespace, model, case: list):
    """Chained LoraLoaderModelOnly nodes; returns the patched model and the keys ComfyUI did not load."""
    catcher = _NotLoaded()
    logging.getLogger().addHandler(catcher)
    try:
        for stem, strength in case:
            if stem.endswith("_xlabs"):  # see xlabs_as_comfy
                model = xlabs_as_comfy(c, model, stem, strength)
            else:
                (model,) = c.nodes.LoraLoaderModelOnly().load_lora_model_only(model, f"{stem}.safetensors", strength)
    finally:
        logging.getLogger().removeHandler(catcher)
    return model, sorted(set(catcher.keys))


def xlabs_as_comfy(c: SimpleNamespace, model, stem: str, strength: float):
    """ComfyUI 0.3.64's LoraLoader maps XLabs ``*.processor.*`` names only for full-depth files (its USO
    check looks for double block 18 and single block 37), so it ignores shallower XLabs files; the
    reference applies ComfyUI's own mapping of those names (``lora_convert.convert_uso_lora``) to the
    file, then loads it as LoraLoaderModelOnly does."""
    lora = c.comfy.utils.load_torch_file(str(LORA_DIR / f"{stem}.safetensors"), safe_load=True)
    patched, _ = c.comfy.sd.load_lora_for_models(model, None, c.comfy.lora_convert.convert_uso_lora(lora), strength, 0)
    return patched


def patched_weights(comfy, model) -> dict[str, dict]:
    """Checksums of every weight a LoRA patch touches (ComfyUI's patch_model, then unpatched)."""
    keys = sorted(model.patches)
    # KSampler leaves the previous case's model loaded WITH its patches; unload it first, or the backup
    # taken by patch_model would be of patched weights.
    comfy.model_management.unload_all_models()
    model.patch_model()
    try:
        state = model.model.state_dict()
        return {k[len("diffusion_model.") :]: stats(state[k]) for k in keys}
    finally:
        model.unpatch_model()


def sample(c: SimpleNamespace, family: str, model) -> tuple[torch.Tensor, torch.Tensor]:
    s = SAMPLING[family]
    latent = {"samples": torch.zeros(LATENT_SHAPE)}
    (out,) = c.nodes.KSampler().sample(
        model,
        SEED,
        s["steps"],
        s["cfg"],
        s["sampler_name"],
        s["scheduler"],
        conditioning(family, "positive"),
        conditioning(family, "negative"),
        latent,
        denoise=1.0,
    )
    sigmas = c.comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), s["scheduler"], s["steps"])
    return out["samples"], sigmas


def module_counts(c: SimpleNamespace, model, stem: str) -> dict:
    """How many LoRA modules of ``stem`` ComfyUI's key map matches on ``model`` (and how many keys)."""
    lora = c.comfy.utils.load_torch_file(str(LORA_DIR / f"{stem}.safetensors"), safe_load=True)
    key_map = c.comfy.lora.model_lora_keys_unet(model.model, {})
    loaded = c.comfy.lora.load_lora(c.comfy.lora_convert.convert_lora(lora), key_map, log_missing=False)
    return {"tensors": len(lora), "patches": len(loaded)}


# -- text encoders -----------------------------------------------------------------------------------
def tiny_text_encoder(c: SimpleNamespace, kind: str, width: int, layers: int):
    """A tiny text encoder built with ComfyUI's own classes (their tensor names feed its CLIP key map)."""
    ops = c.comfy.ops.disable_weight_init
    if kind == "clip":
        import comfy.clip_model

        config = {"num_hidden_layers": layers, "hidden_size": width, "num_attention_heads": 4,
                  "intermediate_size": 2 * width, "hidden_act": "quick_gelu", "max_position_embeddings": 77,
                  "eos_token_id": 2, "vocab_size": 64}  # fmt: skip
        return comfy.clip_model.CLIPTextModel(config, torch.float32, "meta", ops)
    import comfy.text_encoders.t5

    config = {"num_layers": layers, "d_model": width, "d_kv": 8, "num_heads": 4, "d_ff": 2 * width,
              "dense_act_fn": "gelu_pytorch_tanh", "is_gated_act": True, "model_type": "t5", "vocab_size": 64}  # fmt: skip
    return comfy.text_encoders.t5.T5(config, torch.float32, "meta", ops)


def text_encoder_reference(c: SimpleNamespace, family: str) -> dict:
    """ComfyUI's CLIP key map and calculate_weight on hash-valued tiny text encoders (strength_clip)."""
    shapes = {}
    for role, (kind, width, layers) in lf.TEXT_ENCODERS[family].items():
        for name, tensor in tiny_text_encoder(c, kind, width, layers).state_dict().items():
            shapes[f"{role}.transformer.{name}"] = tuple(tensor.shape)
    fake = SimpleNamespace(state_dict=lambda: dict.fromkeys(shapes))
    key_map = c.comfy.lora.model_lora_keys_clip(fake, {})
    per_key: dict[str, list] = {}
    matched = {}
    for stem, strength in TEXT_CASES[family]:
        lora = c.comfy.utils.load_torch_file(str(LORA_DIR / f"{stem}.safetensors"), safe_load=True)
        loaded = c.comfy.lora.load_lora(lora, key_map, log_missing=False)
        matched[stem] = sorted(loaded)
        for key, patch in loaded.items():
            per_key.setdefault(key, []).append((strength, patch, 1.0, None, None))
    out = {}
    for key, patches in sorted(per_key.items()):
        weight = lf.base_value(key, shapes[key]).clone()
        out[key] = stats(c.comfy.lora.calculate_weight(patches, weight, key))
    return {"case": [list(x) for x in TEXT_CASES[family]], "matched": matched, "patched": out}


# -- main --------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=None)
    parser.add_argument("--out", type=Path, default=HERE / "comfy_lora_reference.json")
    args = parser.parse_args()
    commit = (
        args.commit
        or subprocess.run(
            ["git", "-C", str(args.comfy_dir), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    base = Path(tempfile.mkdtemp(prefix="comfy-lora-ref-"))
    try:
        run(args, commit, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(args: argparse.Namespace, commit: str, base: Path) -> None:
    from safetensors.torch import save_file

    c = import_comfy(args.comfy_dir.resolve(), base)
    torch.set_num_threads(1)
    models_dir = base / "models" / "diffusion_models"
    models_dir.mkdir(parents=True)
    c.folder_paths.add_model_folder_path("diffusion_models", str(models_dir), is_default=True)
    c.folder_paths.add_model_folder_path("loras", str(LORA_DIR), is_default=True)
    LORA_DIR.mkdir(exist_ok=True)
    ref: dict = {
        "source": {
            "comfyui_commit": commit,
            "torch": torch.__version__,
            "script": "tests/data/make_comfy_lora_reference.py",
            "stubbed_imports": c.stubbed,
        },
        "latent_shape": list(LATENT_SHAPE),
        "tokens": TOKENS,
        "seed": SEED,
        "models": {},
        "loras": {},
        "cases": CASES,
        "module_counts": {},
        "patched": {},
        "sampling": {},
        "text_encoders": {},
    }
    for family in ("flux", "sd3"):
        for stem, sd in lf.lora_files(family).items():
            path = LORA_DIR / f"{stem}.safetensors"
            save_file(
                {k: (v if k.endswith(".alpha") else v.to(LORA_DTYPE)).contiguous() for k, v in sd.items()}, str(path)
            )
            ref["loras"][stem] = {"sha256": sha256(path), "format": lf.FORMATS[stem.split("_", 1)[1]]}
    loaded = {}
    for family, skeleton in skeletons(c).items():
        path = models_dir / f"tiny_{family}_original.safetensors"
        save_file(lf.base_state_dict(skeleton), str(path))
        ref["models"][family] = {"skeleton": skeleton, "sha256": sha256(path), "file": path.name}
        loaded[family] = load_model(c, family, path.name)
    for family, model in loaded.items():
        ref["module_counts"][family] = {stem: module_counts(c, model, stem) for stem in sorted(ref["loras"])}
        ref["patched"][family], ref["sampling"][family] = {}, {"settings": SAMPLING[family], "cases": {}}
        for case_name, case in CASES[family].items():
            patched, not_loaded = apply_case(c, model, case)
            if case:
                weights = patched_weights(c.comfy, patched)
                ref["patched"][family][case_name] = {"weights": weights, "not_loaded": not_loaded}
            latent, sigmas = sample(c, family, patched)
            ref["sampling"][family]["sigmas"] = [float(f"{v:.9g}") for v in sigmas.tolist()]
            ref["sampling"][family]["cases"][case_name] = tensor_json(latent)
            print(f"{family} {case_name}: {len(patched.patches)} patched weights, |latent| {latent.norm():.4f}")
        ref["text_encoders"][family] = text_encoder_reference(c, family)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB) and {len(ref['loras'])} LoRA files")


if __name__ == "__main__":
    main()
