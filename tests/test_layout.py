"""Layout planner decisions for described machines (no GPU needed)."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.registry import family
from parallel_runtime.models.files import detect_family
from parallel_runtime.models.model_info import model_info_from_path
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.layout import LayoutRequest, ModelInfo, plan_layout
from parallel_runtime.parallel.machine import DeviceInfo, GiB, MachineInfo


def described(family_id: str, *args, **kwargs) -> ModelInfo:
    """A ModelInfo with the family's layout hints (its usual CFG scale and text tokens), as the loader reads it."""
    return ModelInfo(family_id, *args, hints=family(family_id).layout, **kwargs)


FLUX = described("flux", num_heads=24, num_layers=57, hidden_size=3072, weight_bytes=int(23.8 * GiB))  # bf16
SD3 = described("sd3", num_heads=24, num_layers=24, hidden_size=1536, weight_bytes=int(4.2 * GiB))
PIXART = described("pixart", num_heads=16, num_layers=28, hidden_size=1152, weight_bytes=int(1.2 * GiB))


def gpus(mem_gib: list[float], p2p: list[list[bool]] | bool, label: str = "GPU") -> MachineInfo:
    n = len(mem_gib)
    devs = tuple(DeviceInfo(f"cuda:{i}", label, int(m * GiB), int(m * GiB)) for i, m in enumerate(mem_gib))
    if isinstance(p2p, bool):
        p2p = [[p2p or i == j for j in range(n)] for i in range(n)]
    return MachineInfo(devs, tuple(tuple(r) for r in p2p))


def test_two_nvlink_gpus_use_ulysses_without_cfg():
    plan = plan_layout(MachineInfo.uniform(2, 80, p2p=True), SD3, LayoutRequest(cfg=1.0))
    assert plan.config == ParallelConfig(ulysses=2)
    assert "NVLink/P2P" in plan.reason and "24 heads" in plan.reason
    assert plan.devices == ("cuda:0", "cuda:1")


def test_two_nvlink_gpus_use_cfg_parallel_when_cfg_above_one():
    plan = plan_layout(MachineInfo.uniform(2, 80, p2p=True), SD3, LayoutRequest(cfg=4.5))
    assert plan.config == ParallelConfig(cfg=2)
    assert "cfg 4.5 > 1" in plan.reason


def test_family_default_cfg_flux_is_guidance_distilled():
    plan = plan_layout(MachineInfo.uniform(2, 80, p2p=True), FLUX)  # cfg=None -> Flux default 1.0
    assert plan.config == ParallelConfig(ulysses=2)
    assert "no CFG parallel" in plan.reason


def test_four_pcie_gpus_without_p2p_use_pipefusion():
    plan = plan_layout(MachineInfo.uniform(4, 48, p2p=False), SD3, LayoutRequest(cfg=1.0))
    assert plan.config == ParallelConfig(pp=4)
    assert plan.pp_patches == 4
    assert "PCIe without P2P" in plan.reason


def test_four_pcie_gpus_with_cfg_split_cfg_then_pipefusion():
    plan = plan_layout(MachineInfo.uniform(4, 48, p2p=False), SD3, LayoutRequest(cfg=5.0))
    assert plan.config == ParallelConfig(cfg=2, pp=2)
    assert "CFG parallel" in plan.reason and "PCIe without P2P" in plan.reason


def test_nvlink_pairs_put_ulysses_inside_pairs():
    # 0-2 and 1-3 are NVLink bridged; no P2P across pairs. Ranks must be placed pair by pair.
    p2p = [[i == j or {i, j} in ({0, 2}, {1, 3}) for j in range(4)] for i in range(4)]
    plan = plan_layout(gpus([24] * 4, p2p), SD3, LayoutRequest(cfg=1.0))
    assert plan.config == ParallelConfig(pp=2, ulysses=2)
    assert plan.devices == ("cuda:0", "cuda:2", "cuda:1", "cuda:3")


def test_heads_that_do_not_divide_fall_back_to_ring():
    odd = described("sd3", num_heads=6, num_layers=24, hidden_size=384, weight_bytes=GiB)
    plan = plan_layout(MachineInfo.uniform(4, 80, p2p=True), odd, LayoutRequest(cfg=1.0))
    assert plan.config == ParallelConfig(ring=2, ulysses=2)
    assert "ring=2" in plan.reason


def test_mixed_24gb_and_12gb_cards_get_uneven_stage_weights():
    model = described("flux", num_heads=24, num_layers=57, hidden_size=3072, weight_bytes=16 * GiB)
    machine = gpus([24, 12], True, label="RTX")
    plan = plan_layout(machine, model, LayoutRequest(width=1024, height=1024))
    assert plan.config == ParallelConfig(pp=2)
    w = plan.pp_stage_weights
    assert w is not None and len(w) == 2 and w[0] > 0.6 and abs(sum(w) - 1) < 1e-2
    assert "does not fit" in plan.reason and "uneven stage weights" in plan.reason and "12.0 GiB free" in plan.reason


def test_model_that_does_not_fit_one_card_uses_pipefusion_even_with_nvlink():
    big = described("flux", num_heads=24, num_layers=57, hidden_size=3072, weight_bytes=30 * GiB)
    plan = plan_layout(MachineInfo.uniform(2, 24, p2p=True), big, LayoutRequest(cfg=1.0))
    assert plan.config == ParallelConfig(pp=2)
    assert plan.pp_stage_weights is None
    assert "does not fit one device" in plan.reason


def test_model_too_big_for_all_devices_is_a_clear_error():
    huge = described("flux", num_heads=24, num_layers=57, hidden_size=3072, weight_bytes=100 * GiB)
    with pytest.raises(ConfigError, match="needs about 100.0 GiB") as err:
        plan_layout(MachineInfo.uniform(2, 24, p2p=True), huge)
    assert "fix:" in str(err.value)


def test_cpu_only():
    plan = plan_layout(MachineInfo.cpu(2, memory_bytes=8 * GiB), PIXART, LayoutRequest(cfg=1.0))
    assert plan.config == ParallelConfig(ulysses=2)
    assert plan.devices == ("cpu", "cpu")
    assert "CPU" in plan.reason
    single = plan_layout(MachineInfo.cpu(1), PIXART)
    assert single.config == ParallelConfig() and "single-device" in single.reason
    # A busy host (1 GiB available, less than a GPU's reserve): CPU ranks keep no CUDA reserve, so a model that
    # fits their share runs unsplit instead of being refused.
    small = dataclasses.replace(PIXART, weight_bytes=GiB // 4)
    busy = plan_layout(MachineInfo.cpu(2, memory_bytes=2 * GiB), small, LayoutRequest(cfg=1.0))
    assert busy.config == ParallelConfig(ulysses=2)
    split = plan_layout(MachineInfo.cpu(2, memory_bytes=2 * GiB), PIXART, LayoutRequest(cfg=1.0))
    assert split.config == ParallelConfig(pp=2)  # larger than a rank's share (1.2 > 1 GiB): split into stages


def test_detect_without_gpu_degrades_to_cpu():
    machine = MachineInfo.detect()  # CI has no GPU
    assert machine.is_cpu and len(machine.devices) == 1
    assert MachineInfo.detect("cpu:3").devices[0].name == "cpu" and len(MachineInfo.detect("cpu:3").devices) == 3
    with pytest.raises(ConfigError, match="CUDA GPU"):
        MachineInfo.detect("cuda:0,cuda:1")


def test_model_info_from_tiny_diffusers_folder():
    from dit_devtools.tiny import ensure_tiny_model

    info = model_info_from_path(ensure_tiny_model("tiny-flux"), dtype="fp32")
    assert info.family == "flux" and info.num_heads == 4 and info.num_layers == 4 and info.weight_bytes > 0


def _write_safetensors(path, names):
    header = {
        n: {"dtype": "BF16", "shape": [8, 4], "data_offsets": [i * 64, (i + 1) * 64]} for i, n in enumerate(names)
    }
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 64 * len(names))


def test_single_file_family_detection_and_wrong_family(tmp_path):
    f = tmp_path / "sd3.safetensors"
    _write_safetensors(f, ["joint_blocks.0.x_block.attn.qkv.weight", "joint_blocks.1.x_block.attn.qkv.weight"])
    info = model_info_from_path(f)
    assert info.family == "sd3" and info.num_layers == 2
    with pytest.raises(ConfigError, match="is a sd3 transformer but family 'flux' was chosen"):
        model_info_from_path(f, family="flux")
    assert detect_family(["double_blocks.0.img_attn.qkv.weight"]) == "flux"
    assert detect_family(["vae.decoder.conv_in.weight"]) is None


def test_reason_says_when_the_image_size_is_assumed():
    machine = MachineInfo.uniform(2, 80, p2p=True)
    guessed = plan_layout(machine, SD3, LayoutRequest(cfg=1.0))
    assert "4096 image tokens if the image is 1024x1024 (the loader cannot see" in guessed.reason
    known = plan_layout(machine, SD3, LayoutRequest(width=512, height=768, cfg=1.0))
    assert "1536 image tokens (512x768)" in known.reason  # (768/16) * (512/16)


def test_video_models_plan_with_video_token_counts():
    """Wan: tokens = latent frames x rows x cols (81 frames of 832x480 assumed before the sampler runs),
    Ulysses only with a degree dividing the heads (12 for Wan 2.1 1.3B), cross-attention text (no joint tokens)."""
    wan13 = described("wan", 12, 30, 1536, int(2.8 * GiB), token_pixels=16, frames_per_latent=4)
    request = LayoutRequest(cfg=1.0)
    assert request.latent_frames(wan13) == 21 and request.tokens(wan13) == 21 * 30 * 52
    assert request.token_rows(wan13) == 21 * 30
    plan = plan_layout(MachineInfo.uniform(8, 80, p2p=True), wan13, request)
    assert (plan.config.ulysses, plan.config.ring) == (4, 2)  # 12 heads: Ulysses 4, the rest on the ring
    assert "32760 video tokens if the video is 832x480x81 frames" in plan.reason
    known = LayoutRequest(width=1280, height=720, frames=121, cfg=5.0)
    ti2v = described("wan", 24, 30, 3072, 10 * GiB, token_pixels=32, frames_per_latent=4)
    assert known.tokens(ti2v) == 31 * 22 * 40 and "27280 video tokens (1280x720x121 frames)" in known.describe_size(
        ti2v
    )
    plan = plan_layout(MachineInfo.uniform(8, 80, p2p=True), ti2v, known)
    assert (plan.config.cfg, plan.config.ulysses) == (2, 4)
    assert LayoutRequest().tokens(SD3) == 4096  # image models unchanged


@pytest.mark.parametrize(("out_dim", "pixels"), [(16, 16), (48, 32)])
def test_wan_single_file_model_info(tmp_path, out_dim, pixels):
    import sys
    from pathlib import Path

    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).parent / "data"))
    from wan_tiny_weights import TinyWan, tiny_wan_state_dict

    path = tmp_path / "wan.safetensors"
    save_file(tiny_wan_state_dict(TinyWan(in_dim=out_dim, out_dim=out_dim), "info"), str(path))
    info = model_info_from_path(path)
    assert (info.family, info.num_heads, info.num_layers, info.hidden_size) == ("wan", 2, 2, 256)
    assert (info.token_pixels, info.frames_per_latent) == (pixels, 4)
