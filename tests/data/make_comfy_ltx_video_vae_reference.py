"""Regenerate tests/data/comfy_ltx_video_vae_reference.json by running ComfyUI's OWN LTX-Video VAE decode on a tiny
0.9.1-style checkpoint.

Run by hand (not in CI) with the Python that imports the ComfyUI snapshot (nothing is written there):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_ltx_video_vae_reference.py /work/shared/ComfyUI
    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_ltx_video_vae_reference.py /work/shared/ComfyUI --release 0.9.0

What runs is ComfyUI's: a checkpoint (the tiny transformer of ``ltx_video_tiny_weights`` under
``model.diffusion_model.``, the tiny 0.9.1-style VAE decoder of ``ltx_video_vae_tiny_weights`` under ``vae.``, the
VAE's structure in the ``config`` metadata as Lightricks' files carry it) is loaded with
``comfy.sd.load_checkpoint_guess_config`` (CheckpointLoaderSimple's path) and a generated LATENT decoded with
``VAEDecode``. ComfyUI's LTX VAE decode draws its noise (the latent's, 0.025, and the decoder's injected noise) from
torch's global generator without a seed, so each decode here runs right after ``torch.manual_seed(seed)``; one more
decode without reseeding shows how much ComfyUI's own output moves between runs. The IMAGE is stored every
``STRIDE``-th value (flattened), with its shape and a few statistics.

``--release 0.9.0`` writes tests/data/comfy_ltx_video_vae090_reference.json instead: the tiny 0.9.0 VAE of
``ltx_video_vae090_tiny_weights`` (decoder and statistics; ComfyUI never reads the encoder to decode) in a checkpoint
whose metadata states no ``spatial_padding_mode`` (ComfyUI's decoder pads with reflect), and the same checkpoint
stating ``zeros``; the 0.9.0 decoder draws no noise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import prepare_comfy  # noqa: E402
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402
from ltx_video_vae090_tiny_weights import checkpoint_metadata as metadata090  # noqa: E402
from ltx_video_vae090_tiny_weights import tiny_ltx_vae090_state_dict  # noqa: E402
from ltx_video_vae_tiny_weights import checkpoint_metadata, tiny_ltx_vae_state_dict  # noqa: E402
from make_comfy_wan_reference import COMFY_COMMIT, dump_json, generated  # noqa: E402
from wan_tiny_weights import state_digest  # noqa: E402

LATENT_SHAPE = (1, 128, 2, 2, 2)  # -> 9 frames of 64x64
STRIDE = 4
SEEDS = (3, 11)


def import_comfy(comfy_dir: Path, base: Path) -> SimpleNamespace:
    prepare_comfy(comfy_dir, base, stub_missing=False)
    import comfy.sd

    import nodes

    return SimpleNamespace(sd=comfy.sd, nodes=nodes)


def strided(image: torch.Tensor) -> dict:
    flat = image.detach().float().flatten()
    return {
        "shape": list(image.shape),
        "stride": STRIDE,
        "data": [float(f"{v:.9g}") for v in flat[::STRIDE].tolist()],
        "clamped_fraction": float(((flat <= 0) | (flat >= 1)).float().mean()),
    }


def release_090(c: SimpleNamespace, tmp: Path) -> dict:
    """ComfyUI's VAEDecode of the tiny 0.9.0 VAE: metadata stating no padding (reflect), then stating zeros."""
    from safetensors.torch import save_file

    vae_state = tiny_ltx_vae090_state_dict()
    decoder_state = {k: v for k, v in vae_state.items() if not k.startswith("encoder.")}
    state = {"model.diffusion_model." + k: v for k, v in tiny_ltx_video_state_dict(TinyLTXVideo()).items()}
    state.update({"vae." + k: v.contiguous() for k, v in decoder_state.items()})
    latent, recipe = generated("ltx-vae/latent", LATENT_SHAPE, 1.0)
    result = {
        "comfy_commit": COMFY_COMMIT,
        "decoder_digest": state_digest({k: v.reshape(-1) for k, v in decoder_state.items()}),
        "latent": recipe,
    }
    for name, extra in (("stated_none", {}), ("stated_zeros", {"spatial_padding_mode": "zeros"})):
        path = tmp / f"ltx-video-tiny-v0.9-{name}.safetensors"
        save_file(state, str(path), metadata=metadata090(**extra))
        vae = c.sd.load_checkpoint_guess_config(str(path), output_vae=True, output_clip=False)[2]
        decoder = vae.first_stage_model.decoder
        missing = [
            k for k in decoder_state if k.startswith("decoder.") and k not in decoder.state_dict(prefix="decoder.")
        ]
        assert not missing, missing
        (image,) = c.nodes.VAEDecode().decode(vae, {"samples": latent})
        result[name] = {"padding_mode": decoder.conv_in.conv.padding_mode, "image": strided(image)}
        del vae
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--release", choices=("0.9.1", "0.9.0"), default="0.9.1")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.release == "0.9.0":
        out = args.out or Path(__file__).with_name("comfy_ltx_video_vae090_reference.json")
        with tempfile.TemporaryDirectory() as tmp:
            result = release_090(import_comfy(args.comfy_dir.resolve(), Path(tmp)), Path(tmp))
        out.write_text(dump_json(result) + "\n")
        print(f"wrote {out}")
        return
    args.out = args.out or Path(__file__).with_name("comfy_ltx_video_vae_reference.json")
    with tempfile.TemporaryDirectory() as tmp:
        c = import_comfy(args.comfy_dir.resolve(), Path(tmp))
        from safetensors.torch import save_file

        vae_state = tiny_ltx_vae_state_dict()
        state = {"model.diffusion_model." + k: v for k, v in tiny_ltx_video_state_dict(TinyLTXVideo()).items()}
        state.update({"vae." + k: v.contiguous() for k, v in vae_state.items()})
        path = Path(tmp) / "ltx-video-tiny-v0.9.1.safetensors"
        save_file(state, str(path), metadata=checkpoint_metadata())
        out = c.sd.load_checkpoint_guess_config(str(path), output_vae=True, output_clip=False)
        vae = out[2]
        decoder = vae.first_stage_model.decoder
        missing = [k for k in vae_state if k.startswith("decoder.") and k not in decoder.state_dict(prefix="decoder.")]
        assert not missing, missing  # every tensor of the file went into ComfyUI's decoder
        latent, recipe = generated("ltx-vae/latent", LATENT_SHAPE, 1.0)
        runs = []
        for seed in SEEDS:
            torch.manual_seed(seed)
            (image,) = c.nodes.VAEDecode().decode(vae, {"samples": latent})
            runs.append({"seed": seed, "image": strided(image)})
        torch.manual_seed(SEEDS[0])
        (first,) = c.nodes.VAEDecode().decode(vae, {"samples": latent})
        (again,) = c.nodes.VAEDecode().decode(vae, {"samples": latent})  # torch's generator moved on: other noise
        result = {
            "comfy_commit": COMFY_COMMIT,
            "vae_digest": state_digest({k: v.reshape(-1) for k, v in vae_state.items()}),
            "vae_class": type(vae.first_stage_model).__name__,
            "padding_mode": decoder.conv_in.conv.padding_mode,
            "latent": recipe,
            "runs": runs,
            "unseeded_rerun_max_diff": float((first - again).abs().max()),
        }
    args.out.write_text(dump_json(result) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
