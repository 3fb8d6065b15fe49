"""A first picture fast: the host's checks before a load read the model's config without importing diffusers
(seconds of CPU that the starting workers need), and tell the same geometry as a transformer built by
diffusers would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parallel_runtime.models.builtin import BUILTIN_MODELS, builtin_model_path
from parallel_runtime.models.single_file import inspect_single_file
from parallel_runtime.service.host_checks import _plan_from_class, _plan_from_config, host_geometry

DATA = Path(__file__).parent / "data"
SINGLE_FILES = ["comfy_ref_flux_dev.safetensors", "comfy_ref_sd3.safetensors", "tiny_qwen_image_bf16.safetensors"]


def _config(name: str) -> dict:
    if name in BUILTIN_MODELS:
        return json.loads((builtin_model_path(name) / "transformer" / "config.json").read_text(encoding="utf-8"))
    return dict(inspect_single_file(DATA / name).config)


@pytest.mark.parametrize("name", [*BUILTIN_MODELS, *SINGLE_FILES])
def test_the_plan_from_the_config_is_the_plan_of_the_built_transformer(name):
    config = _config(name)
    fast = _plan_from_config(config)
    assert fast is not None, f"{name}: the host would import diffusers for its geometry"
    assert fast == _plan_from_class(config)


def test_a_config_that_leaves_a_field_to_the_class_default_is_read_through_the_class(tmp_path):
    config = _config("tiny-sd3")
    del config["pos_embed_max_size"]  # SD3Transformer2DModel's default: 96
    assert _plan_from_config(config) is None
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert host_geometry(tmp_path)["max_grid_side"] == 96


def test_the_cli_s_checks_before_the_load_import_neither_diffusers_nor_transformers():
    code = (
        "import sys\n"
        "from parallel_runtime.tools import generate\n"
        "from parallel_runtime.service.api import LoadRequest, check_sample_request\n"
        "size = check_sample_request(LoadRequest('tiny-flux-shapes', 'cpu:2'), 256, 256, batch_size=1, seed=0,"
        " steps=8, cfg=1.0, denoise=1.0, guidance=3.5, sampler='euler', scheduler='simple')\n"
        "print(size.width, sorted(m for m in ('diffusers', 'transformers') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["256", "[]"]


def test_bench_runtime_times_the_readme_command_s_cold_load_and_where_it_goes():
    from parallel_runtime.tools.cold_start import cold_load

    result = cold_load(runs=1)
    probe = result["cold_load_phases"]
    walls = probe["wall_s"]
    for phase in ("host_imports_s", "host_checks_s", "workers_ready_s", "load_job_s", "first_text_encode_s"):
        assert walls[phase] > 0, phase
    steps = ("host_imports_s", "host_checks_s", "workers_ready_s", "load_job_s")
    assert walls["total_s"] == pytest.approx(sum(walls[k] for k in steps))
    assert result["cold_load_s"] == result["cold_load_runs_s"][0] > walls["host_imports_s"]
    assert len(probe["cpu_s"]["workers_after_load"]) == 2 and probe["host_imported_before_load"] == []
    assert len(result["cold_load_load_average_1m"]) == 2
