"""A Flux Union ControlNet graph run end to end in a real ComfyUI 0.3.64 server: one prompt holds ComfyUI's own
UNETLoader + ControlNetLoader + SetUnionControlNetType + ControlNetApplyAdvanced (hint encoded by a VAE from
VAELoader) + KSampler, and the same ControlNet file through Parallel ControlNet Loader and the same core apply
nodes into the Parallel Sampler, on the same conditioning (Parallel Text Encode, FluxGuidance) and empty latent.
Both latents are saved by ComfyUI's SaveLatent and must agree to 1e-4 (relative L2) on one CPU rank and on a
two-rank Ulysses pool. The ControlNet changes the picture (a run without it is far off), and ComfyUI's own loaded
ControlNet on the Parallel Sampler is an error naming the node to use.

The session's server (conftest.py) starts through tiny_widths.py, so ComfyUI's Flux detection reads the tiny
transformer's widths (tiny-flux's, in Black Forest Labs' layout) and the tiny Union ControlNet built here at the same
widths; its VAE is a random TAEF1 from ComfyUI's own class (tiny_taef1.py). This module adds those files and the hint
to the server's base directory (ComfyUI lists its folders when asked), and at its end removes them and unloads its
pools. One server, three prompts.
"""

from __future__ import annotations

import functools
import itertools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from comfy_client import ComfyClient
from comfy_server import ComfyServer

pytestmark = pytest.mark.timeout(2400)  # the session fixtures may build ComfyUI's venv first (minutes)

HERE = Path(__file__).resolve().parent
MODEL = "tiny_flux_dev_bfl.safetensors"
CONTROLNET = "tiny_flux_union.safetensors"
HINT = "controlnet_hint.png"
TOLERANCE = 1e-4  # relative L2, as tests/test_controlnet_flux.py against ComfyUI's stored samples
LATENT = {"width": 64, "height": 48, "batch_size": 1}  # a [1, 16, 6, 8] latent: 12 tokens, split over 2 ranks
SAMPLING = {"steps": 3, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}
_seeds = itertools.count(26)


def tiny_flux_union(path: Path) -> Path:
    """The tiny Union ControlNet of tests/controlnet_files.py at tiny-flux's widths (its pooled text is wider)."""
    from controlnet_files import FLUX_UNION_CONFIG, flux_union_state  # tests/ helper
    from safetensors.torch import save_file

    from dit_devtools.tiny import ensure_tiny_model

    flux = json.loads((ensure_tiny_model("tiny-flux") / "transformer" / "config.json").read_text())
    widths = ("num_attention_heads", "attention_head_dim", "joint_attention_dim", "pooled_projection_dim")
    save_file(flux_union_state({**FLUX_UNION_CONFIG, **{k: flux[k] for k in widths}}), str(path))
    return path


def tiny_flux_bfl(path: Path) -> Path:
    """tiny-flux's transformer as a single file in Black Forest Labs' layout (for ComfyUI's UNETLoader)."""
    from original_layout_files import write_original  # tests/ helper
    from safetensors.torch import load_file

    from dit_devtools.tiny import ensure_tiny_model

    state = load_file(str(ensure_tiny_model("tiny-flux") / "transformer" / "diffusion_pytorch_model.safetensors"))
    return write_original(state, "flux", path)


def hint_png(path: Path) -> None:
    """A hint picture of another size and aspect than the latent's (ComfyUI crops and scales it)."""
    from PIL import Image

    rows = torch.linspace(0, 1, 40)[:, None, None]
    cols = torch.linspace(0, 1, 72)[None, :, None]
    bands = torch.sin(9.0 * rows + 5.0 * cols + torch.tensor([0.0, 1.5, 3.0])) * 0.5 + 0.5
    Image.fromarray((bands * 255).round().to(torch.uint8).numpy()).save(path)


@pytest.fixture(scope="module")
def controlnet_server(comfy_server, comfy_python, comfy_snapshot, comfy_env, tmp_path_factory):
    """The session's server with this module's model files and hint picture in its base directory."""
    work = tmp_path_factory.mktemp("comfyui-controlnet-files")
    models = work / "models"
    (models / "diffusion_models").mkdir(parents=True)
    tiny_flux_bfl(models / "diffusion_models" / MODEL)
    (models / "controlnet").mkdir()
    tiny_flux_union(models / "controlnet" / CONTROLNET)
    subprocess.run(
        [str(comfy_python), str(HERE / "tiny_taef1.py"), str(comfy_snapshot), str(models / "vae_approx")],
        cwd=work,
        env=comfy_env,
        capture_output=True,
        timeout=300,
        check=True,
    )
    (work / "input").mkdir()
    hint_png(work / "input" / HINT)
    added = [  # (made here, its place in the server's base directory)
        (made, comfy_server.base / made.relative_to(work)) for made in sorted(work.rglob("*")) if made.is_file()
    ]
    for made, place in added:
        assert not place.exists(), f"{place} is already in the session's base directory"
        place.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(made, place)
    try:
        yield comfy_server
    finally:
        for _, place in added:
            place.unlink(missing_ok=True)
        if comfy_server.alive():  # the next modules count the workers of their own pools
            with ComfyClient(comfy_server.url) as client:
                assert client.post("/dit_parallel/unload")["pools"] == []


def defaults(object_info: dict[str, Any], class_type: str, **inputs: Any) -> dict[str, Any]:
    """A node's widget inputs at their defaults (a combo's first option), with ``inputs`` over them."""
    out: dict[str, Any] = {}
    for section in ("required", "optional"):
        for name, entry in object_info[class_type]["input"].get(section, {}).items():
            kind, opts = entry[0], (entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {})
            if "default" in opts:
                out[name] = opts["default"]
            elif isinstance(kind, list) and kind:
                out[name] = kind[0]
    out.update(inputs)
    return {"class_type": class_type, "inputs": out}


LAYOUTS = ("1rank", "ulysses2")  # the Parallel Sampler on one CPU rank, and on two ranks with Ulysses


def controlnet_prompt(object_info: dict[str, Any], seed: int) -> dict[str, Any]:
    """The graph: conditioning (encoded on the one-rank pool), hint and latent shared; ComfyUI's ControlNet path into
    KSampler (saved by node 15); the same file through Parallel ControlNet Loader into the Parallel Sampler on one
    rank (24) and on Ulysses 2 (42); the one-rank Parallel Sampler without a ControlNet (31)."""
    node = functools.partial(defaults, object_info)
    apply = {"strength": 0.8, "start_percent": 0.0, "end_percent": 0.8}
    union = {"type": "canny/lineart/anime_lineart/mlsd"}
    sampling = {"seed": seed, **SAMPLING}
    loader = {"model": "tiny-flux", "family": "flux", "layout": "manual", "dtype": "fp32"}
    return {
        "1": node("DiTParallelModelLoader", devices="cpu:1", ulysses=1, **loader),
        "40": node("DiTParallelModelLoader", devices="cpu:2", ulysses=2, **loader),
        "2": node(
            "DiTParallelTextEncode",
            parallel_model=["1", 0],
            text="a lighthouse on a rocky coast",
        ),
        "3": node("FluxGuidance", conditioning=["2", 0], guidance=3.5),
        "4": node(
            "DiTParallelTextEncode",
            parallel_model=["1", 0],
            text="blurry",
        ),
        "5": node("LoadImage", image=HINT),
        "6": node("VAELoader", vae_name="taef1"),
        "7": node("EmptySD3LatentImage", **LATENT),
        # ComfyUI's own ControlNet into its KSampler
        "10": node("UNETLoader", unet_name=MODEL, weight_dtype="default"),
        "11": node("ControlNetLoader", control_net_name=CONTROLNET),
        "12": node("SetUnionControlNetType", control_net=["11", 0], **union),
        "13": node(
            "ControlNetApplyAdvanced",
            positive=["3", 0],
            negative=["4", 0],
            control_net=["12", 0],
            image=["5", 0],
            vae=["6", 0],
            **apply,
        ),
        "14": node(
            "KSampler", model=["10", 0], positive=["13", 0], negative=["13", 1], latent_image=["7", 0], **sampling
        ),
        "15": node("SaveLatent", samples=["14", 0], filename_prefix="controlnet/ksampler"),
        # the same file through Parallel ControlNet Loader into the Parallel Sampler
        "20": node("DiTParallelControlNetLoader", control_net_name=CONTROLNET),
        "21": node("SetUnionControlNetType", control_net=["20", 0], **union),
        "22": node(
            "ControlNetApplyAdvanced",
            positive=["3", 0],
            negative=["4", 0],
            control_net=["21", 0],
            image=["5", 0],
            vae=["6", 0],
            **apply,
        ),
        "23": node(
            "DiTParallelSampler",
            parallel_model=["1", 0],
            positive=["22", 0],
            negative=["22", 1],
            latent_image=["7", 0],
            **sampling,
        ),
        "24": node("SaveLatent", samples=["23", 0], filename_prefix="controlnet/parallel"),
        # no ControlNet
        "30": node(
            "DiTParallelSampler",
            parallel_model=["1", 0],
            positive=["3", 0],
            negative=["4", 0],
            latent_image=["7", 0],
            **sampling,
        ),
        "31": node("SaveLatent", samples=["30", 0], filename_prefix="controlnet/plain"),
        # the ControlNet on Ulysses 2
        "41": node(
            "DiTParallelSampler",
            parallel_model=["40", 0],
            positive=["22", 0],
            negative=["22", 1],
            latent_image=["7", 0],
            **sampling,
        ),
        "42": node("SaveLatent", samples=["41", 0], filename_prefix="controlnet/ulysses2"),
    }


def saved_latent(server: ComfyServer, outputs: dict[str, Any], node: str) -> torch.Tensor:
    from safetensors.torch import load_file

    (entry,) = outputs[node]["latents"]
    return load_file(str(server.base / "output" / entry["subfolder"] / entry["filename"]))["latent_tensor"]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, (tuple(got.shape), tuple(expected.shape))
    return float((got.float() - expected.float()).norm() / expected.float().norm())


@pytest.fixture(scope="module")
def controlnet_client(controlnet_server):
    with ComfyClient(controlnet_server.url) as client:
        yield client, client.get("/object_info", timeout=120)
    assert controlnet_server.alive(), f"ComfyUI died:\n{controlnet_server.log_tail()}"


@pytest.fixture(scope="module")
def latents(controlnet_server, controlnet_client) -> dict[str, torch.Tensor]:
    """The graph's saved latents: ksampler, 1rank, ulysses2, plain."""
    client, object_info = controlnet_client
    run = client.run(controlnet_prompt(object_info, next(_seeds)), timeout=900)
    assert run.outcome == "execution_success", run.messages[-5:]
    outputs = client.history(run.prompt_id)["outputs"]
    nodes = {"ksampler": "15", "1rank": "24", "ulysses2": "42", "plain": "31"}
    return {name: saved_latent(controlnet_server, outputs, n) for name, n in nodes.items()}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_parallel_sampler_with_controlnet_equals_ksampler_in_the_same_graph(latents, layout):
    expected, got = latents["ksampler"], latents[layout]
    assert expected.shape == (1, 16, 6, 8)
    error = relative_error(got, expected)
    print(f"{layout}: relative L2 {error:.2e}, max abs {(got - expected).abs().max():.2e}")
    assert error <= TOLERANCE, f"Parallel Sampler vs KSampler with the ControlNet on {layout}: {error}"


def test_the_controlnet_changes_the_latent(latents):
    assert relative_error(latents["plain"], latents["ksampler"]) > 100 * TOLERANCE


def test_comfyuis_own_loaded_controlnet_on_the_parallel_sampler_names_the_node_to_use(controlnet_client, latents):
    client, object_info = controlnet_client
    prompt = controlnet_prompt(object_info, next(_seeds))
    prompt["22"]["inputs"]["control_net"] = ["12", 0]  # ComfyUI's Load ControlNet Model, not the Parallel one
    keep = {"1", "2", "3", "4", "5", "6", "7", "11", "12", "22", "23", "24"}
    prompt = {k: v for k, v in prompt.items() if k in keep}
    run = client.run(prompt, timeout=600)
    assert run.outcome == "execution_error", run.messages[-5:]
    error = run.error()
    assert error["node_id"] == "23"
    assert "Parallel ControlNet Loader" in error["exception_message"], error["exception_message"]
