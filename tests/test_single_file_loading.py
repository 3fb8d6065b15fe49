"""Single-file transformers in their original layouts (BFL Flux, Stability MMDiT, PixArt) load to the same
transformer as the diffusers folder, offline: whole, as a .pth, in bf16, and as one PipeFusion stage."""

from __future__ import annotations

import pytest
import torch
from original_layout_files import (  # tests/ helpers
    PIXART_OVERRIDES,
    PREFIX,
    TINY,
    pixart_to_original,
    same_config_value,
    write_original,
)

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer, shipped_config
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage, load_stage_transformer


def forward(family: str, model, seed: int = 0) -> torch.Tensor:
    """One forward pass of a diffusers transformer on fixed random inputs."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    with torch.no_grad():
        if family == "flux":
            rows = cols = 4
            ids = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij"), -1).reshape(-1, 2)
            img_ids = torch.cat([torch.zeros(rows * cols, 1), ids.float()], 1)
            return model(
                hidden_states=torch.randn(1, rows * cols, cfg.in_channels, generator=g),
                encoder_hidden_states=torch.randn(1, 5, cfg.joint_attention_dim, generator=g),
                pooled_projections=torch.randn(1, cfg.pooled_projection_dim, generator=g),
                timestep=torch.tensor([0.7]),
                img_ids=img_ids,
                txt_ids=torch.zeros(5, 3),
                guidance=torch.tensor([3.5]) if cfg.guidance_embeds else None,
            ).sample
        x = torch.randn(1, cfg.in_channels, 8, 8, generator=g)
        if family == "sd3":
            return model(
                hidden_states=x,
                encoder_hidden_states=torch.randn(1, 5, cfg.joint_attention_dim, generator=g),
                pooled_projections=torch.randn(1, cfg.pooled_projection_dim, generator=g),
                timestep=torch.tensor([700.0]),
            ).sample
        return model(
            hidden_states=x,
            encoder_hidden_states=torch.randn(1, 5, cfg.caption_channels, generator=g),
            timestep=torch.tensor([700]),
            added_cond_kwargs={"resolution": torch.tensor([[64.0, 64.0]]), "aspect_ratio": torch.tensor([[1.0]])},
        ).sample


@pytest.mark.parametrize(
    "family, prefix",
    [("flux", ""), ("sd3", PREFIX), ("pixart", ""), ("flux", PREFIX)],
    ids=["flux", "sd3-prefixed", "pixart", "flux-prefixed"],
)
def test_single_file_loads_the_same_transformer(tmp_path, tiny_transformers, family, prefix):
    reference = tiny_transformers[family]
    extra = {"first_stage_model.decoder.conv_in.weight": torch.zeros(2, 2)} if prefix else None
    path = write_original(reference.state_dict(), family, tmp_path / f"{family}.safetensors", prefix, extra)
    overrides = PIXART_OVERRIDES if family == "pixart" else None
    model, found, scheduler = load_single_file_transformer(path, "cpu", torch.float32, overrides=overrides)
    assert found == family and type(model) is type(reference)
    for key, value in reference.config.items():
        if not key.startswith("_") and key not in ("sample_size", "interpolation_scale"):
            assert same_config_value(model.config[key], value), (key, model.config[key], value)
    got, ref = model.state_dict(), reference.state_dict()
    assert sorted(got) == sorted(ref)
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    assert (forward(family, model) - forward(family, reference)).abs().max().item() <= 1e-6
    variant = inspect_single_file(path, overrides=overrides).variant
    assert scheduler == shipped_config(variant)[1]


def test_pixart_pth_file_and_bf16(tmp_path, tiny_transformers):
    """PixArt's own .pth checkpoints nest the weights under "state_dict"; weights load in the asked dtype."""
    reference = tiny_transformers["pixart"]
    path = tmp_path / "PixArt-Sigma-XL-2-1024-MS.pth"
    torch.save({"state_dict": pixart_to_original(reference.state_dict())}, path)
    model, family, scheduler = load_single_file_transformer(path, "cpu", torch.bfloat16, overrides=PIXART_OVERRIDES)
    assert family == "pixart" and scheduler["_class_name"] == "DPMSolverMultistepScheduler"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ref = reference.state_dict()
    assert all(torch.equal(v, ref[k].to(torch.bfloat16)) for k, v in model.state_dict().items() if k in ref)


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_pipefusion_stage_from_a_single_file_equals_the_folder_stage(tmp_path, tiny_transformers, family):
    """Each stage holds exactly the tensors (same values) that the folder's stage loader gives it."""
    folder = ensure_tiny_model(TINY[family])
    path = write_original(tiny_transformers[family].state_dict(), family, tmp_path / "m.safetensors", PREFIX)
    for stage in (0, 1):
        comps, plan, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32, (0.6, 0.4))
        ref, ref_plan, ref_weights = load_stage_transformer(folder, 2, stage, "cpu", torch.float32, (0.6, 0.4))
        assert plan.bounds == ref_plan.bounds and weights == ref_weights
        got, want = dict(comps.transformer.named_parameters()), dict(ref.named_parameters())
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert got[name].device == value.device, name  # "meta" exactly where the folder's stage has it
            if value.device.type != "meta":
                assert torch.equal(got[name], value), name
        assert 0 < weights.param_bytes < weights.total_transformer_bytes
