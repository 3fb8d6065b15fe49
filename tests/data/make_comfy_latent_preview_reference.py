"""Regenerate tests/data/comfy_latent_preview_reference.json from ComfyUI's OWN latent formats.

Run by hand (not in CI), from any directory, with a Python that has torch (``comfy.latent_formats`` imports
nothing else), e.g. the project's venv:

    python tests/data/make_comfy_latent_preview_reference.py /path/to/ComfyUI --commit <ComfyUI git commit>

For every latent format ComfyUI gives the models this project runs (``comfy.supported_models``: Flux, SD3,
PixArt-alpha / sigma, Qwen-Image, Wan 2.1 / 2.2,
HunyuanVideo, Chroma, HiDream, LTX-Video), it stores the format's numbers: scale and shift (or per-channel
mean and std) and the latent -> RGB preview factors and bias. ``tests/test_family_folders.py`` checks every
family folder's ``latent.py`` against them. Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

# comfy.supported_models names -> the latent format class its source assigns (read from the source below)
MODELS = (
    "Flux",
    "FluxSchnell",
    "SD3",
    "PixArtAlpha",
    "PixArtSigma",
    "QwenImage",
    "WAN21_T2V",
    "WAN21_I2V",
    "WAN22_T2V",
    "HunyuanVideo",
    "HunyuanVideoI2V",
    "Chroma",
    "HiDream",
    "LTXV",
)


def latent_format_of_models(comfy_dir: Path) -> dict[str, str]:
    """supported model class -> ``latent_formats.<X>`` it declares (inherited from its base class when absent)."""
    tree = ast.parse((comfy_dir / "comfy" / "supported_models.py").read_text(encoding="utf-8"))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def declared(name: str) -> str | None:
        node = classes.get(name)
        if node is None:
            return None
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "latent_format" for t in stmt.targets):
                return ast.unparse(stmt.value).rsplit(".", 1)[-1]
        for base in node.bases:
            found = declared(ast.unparse(base))
            if found:
                return found
        return None

    return {name: declared(name) for name in MODELS}


def numbers(value) -> list | float | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):  # a float32 tensor: its values as ComfyUI's source writes them
        return [float(f"{v:.6g}") for v in value.flatten().tolist()]
    if isinstance(value, (list, tuple)):
        return [numbers(v) for v in value]
    return float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=None, help="ComfyUI commit (read with git when not given)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "comfy_latent_preview_reference.json"
    )
    args = parser.parse_args()
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(args.comfy_dir))
    import comfy.latent_formats as lf

    models = latent_format_of_models(args.comfy_dir)
    formats = {}
    for name in sorted(set(models.values())):
        fmt = getattr(lf, name)()
        formats[name] = {
            "channels": int(fmt.latent_channels),
            "scale_factor": float(fmt.scale_factor),
            "shift_factor": float(getattr(fmt, "shift_factor", 0.0) or 0.0),
            "latents_mean": numbers(getattr(fmt, "latents_mean", None)),
            "latents_std": numbers(getattr(fmt, "latents_std", None)),
            "latent_rgb_factors": numbers(fmt.latent_rgb_factors),
            "latent_rgb_factors_bias": numbers(fmt.latent_rgb_factors_bias),
        }
    commit = args.commit
    if commit is None:
        proc = subprocess.run(["git", "-C", str(args.comfy_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = proc.stdout.strip() or "unknown"
    out = {"comfyui_commit": commit, "models": models, "formats": formats}
    text = json.dumps(out, indent=1)
    text = re.sub(r"\[\s+([-0-9.e,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    args.out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {', '.join(formats)}")


if __name__ == "__main__":
    main()
