"""Write a random TAEF1 (ComfyUI's tiny 16-channel Flux autoencoder) as ComfyUI's VAELoader finds it.

    <ComfyUI's python> tiny_taef1.py /path/to/ComfyUI <models/vae_approx folder>

Run with ComfyUI's Python: ComfyUI's own ``comfy.taesd.taesd.TAESD`` is built (16 latent channels) and its
encoder and decoder saved as ``taef1_encoder.safetensors`` / ``taef1_decoder.safetensors``, so VAELoader offers
"taef1", a VAE small enough for a CPU test whose real Flux VAE would be 84M parameters. ComfyUI builds these
layers without initialising them; every tensor here is filled from a generator seeded by its name (weights
N(0, 1/fan_in), biases N(0, 0.02)), so the file is the same on every run.
"""

from __future__ import annotations

import math
import sys
import zlib
from pathlib import Path

import torch


def fill(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in sorted(state.items()):
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        value = torch.randn(tuple(tensor.shape), generator=g)
        scale = 0.02 if tensor.ndim == 1 else 1.0 / math.sqrt(math.prod(tensor.shape[1:]))
        out[name] = (value * scale).contiguous()
    return out


def main(snapshot: Path, folder: Path) -> None:
    sys.path.insert(0, str(snapshot))
    sys.argv = [sys.argv[0], "--cpu"]  # ComfyUI's device setup, run on import, reads its arguments
    import comfy.options

    comfy.options.enable_args_parsing()
    from comfy.taesd.taesd import TAESD

    model = TAESD(latent_channels=16)
    folder.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    save_file(fill(model.taesd_encoder.state_dict()), str(folder / "taef1_encoder.safetensors"))
    save_file(fill(model.taesd_decoder.state_dict()), str(folder / "taef1_decoder.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
