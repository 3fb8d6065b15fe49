"""A model family is a folder: what a family states lives in ``parallel_runtime/models/families/<family>/`` and
nowhere else; the registry lists the folders; each folder's facts match their oracles (its shipped configs,
ComfyUI's latent formats); no engine or node file is over 500 lines. (Import circles: tests/test_layering.py.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from parallel_runtime.models.families.registry import FAMILIES, detection_order, family, lora_markers

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "parallel_runtime"
FAMILIES_DIR = PACKAGE / "models" / "families"
REGISTRY = FAMILIES_DIR / "registry.py"
SCANNED = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "nodes").rglob("*.py")])
COMFY_LATENTS = json.loads((ROOT / "tests" / "data" / "comfy_latent_preview_reference.json").read_text())
# our family -> the ComfyUI 0.3.64 supported models that run its files (comfy.supported_models)
COMFY_MODELS = {
    "flux": ("Flux", "FluxSchnell"),
    "flux2": (),  # ComfyUI 0.3.64 has no FLUX.2
    "qwen-image": ("QwenImage",),
    "sd3": ("SD3",),
    "pixart": ("PixArtAlpha", "PixArtSigma"),
    "wan": ("WAN21_T2V", "WAN21_I2V", "WAN22_T2V"),
    "hunyuan-video": ("HunyuanVideo", "HunyuanVideoI2V"),
    "hunyuan-video-1.5": (),  # ComfyUI 0.3.64 has no HunyuanVideo 1.5
    "ltx-video": ("LTXV",),
    "z-image": ("Flux",),  # 0.3.64 has no Z-Image; later ComfyUI's ZImage takes latent_formats.Flux, as Flux does
    "chroma": ("Chroma",),
    "hidream-i1": ("HiDream",),
    "ltx2": (),  # ComfyUI 0.3.64 has no LTX-2
}


def family_names() -> dict[str, str]:
    """Every string that names one family (its id, diffusers classes, shipped variants) -> the family's folder."""
    names: dict[str, str] = {}
    for spec in FAMILIES:
        for name in (spec.id, spec.transformer_class, spec.pipeline_class, *spec.variants):
            names[name] = spec.folder.name
    return names


def strings(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string literal in ``path``, f-string pieces included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def misplaced(names: dict[str, str], files: list[Path]) -> list[str]:
    """``file:line 'name'`` for each family name outside that family's folder and the registry."""
    found = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix() if ROOT in path.parents else str(path)
        if path == REGISTRY:
            continue
        for line, value in strings(path):
            folder = names.get(value)
            if folder is not None and FAMILIES_DIR / folder not in path.parents:
                found.append(f"{rel}:{line} {value!r}")
    return found


def test_family_names_appear_only_in_their_folders_and_the_registry():
    found = misplaced(family_names(), SCANNED)
    assert not found, (
        "these modules name a model family; state the fact in the family's folder (models/families/<family>/) "
        "and ask the registry (models/families/registry.py) here instead:\n" + "\n".join(found)
    )


def test_the_name_check_finds_a_family_table(tmp_path):
    """The check above is not vacuous: the table the layout planner had before the folders is caught."""
    table = tmp_path / "layout.py"
    table.write_text('DEFAULT_CFG = {"flux": 1.0, "sd3": 4.5, "pixart": 4.5, "qwen-image": 2.5, "wan": 5.0}\n')
    table.with_name("files.py").write_text('FAMILY = {"WanTransformer3DModel": "wan"}\nVARIANT = "flux-dev"\n')
    assert len(misplaced(family_names(), [table, table.with_name("files.py")])) == 8


@pytest.mark.parametrize("spec", FAMILIES, ids=lambda s: s.id)
def test_each_folder_states_its_family(spec):
    folder = FAMILIES_DIR / spec.folder.name
    assert spec.folder == folder and folder.name.isidentifier()
    for module in ("__init__.py", "spec.py", "adapter.py", "keys.py", "text.py"):
        assert (folder / module).is_file(), f"{spec.id}: no {module}"
    adapter = spec.adapter()
    assert adapter.family == spec.id and adapter.__module__ == f"parallel_runtime.models.families.{folder.name}.adapter"
    shipped = {p.name for p in (folder / "configs").iterdir() if p.is_dir()}
    assert shipped == set(spec.variants), f"{spec.id}: configs/ holds {sorted(shipped)}, the spec says {spec.variants}"
    for variant in spec.variants:  # every shipped config is a config of the family's transformer
        config = json.loads((spec.config_folder(variant) / "config.json").read_text())
        assert config["_class_name"] == spec.transformer_class
        assert spec.original_layout().anchor, variant
    assert spec.text.max_length > 0 and spec.text.comfy_nodes and spec.label
    assert family(spec.id) is spec


def test_ids_variants_and_markers_are_unambiguous():
    ids = [s.id for s in FAMILIES]
    variants = [v for s in FAMILIES for v in s.variants]
    assert len(set(ids)) == len(ids) and len(set(variants)) == len(variants)
    assert len({s.transformer_class for s in FAMILIES}) == len(FAMILIES)
    # a family whose files hold another family's markers is matched first
    order = [s.id for s in detection_order()]
    assert order.index("flux2") < order.index("flux") < order.index("sd3") < order.index("pixart")
    assert dict(lora_markers())["double_blocks"] == "flux" and dict(lora_markers())["cross_attn"] == "pixart or wan"


def _comfy(name: str) -> dict:
    return COMFY_LATENTS["formats"][name]


@pytest.mark.parametrize("spec", FAMILIES, ids=lambda s: s.id)
def test_preview_factors_are_comfyuis(spec):
    """Each family states the latent -> RGB preview factors of every latent format ComfyUI runs its files with."""
    wanted = {COMFY_LATENTS["models"][m] for m in COMFY_MODELS[spec.id]}
    assert {p.comfy_class for p in spec.previews} == wanted
    for preview in spec.previews:
        comfy = _comfy(preview.comfy_class)
        assert preview.channels == comfy["channels"]
        flat = [v for row in comfy["latent_rgb_factors"] for v in row]
        assert [v for row in preview.rgb_factors for v in row] == pytest.approx(flat, abs=1e-9)
        bias = comfy["latent_rgb_factors_bias"]
        assert (preview.rgb_bias is None and bias is None) or list(preview.rgb_bias) == pytest.approx(bias, abs=1e-9)


def test_latent_formats_are_comfyuis():
    """The numbers each family's latent.py states are those of ComfyUI's latent format for it."""
    from parallel_runtime.models.families.flux.latent import latent_format as flux
    from parallel_runtime.models.families.pixart.latent import latent_format as pixart
    from parallel_runtime.models.families.sd3.latent import latent_format as sd3
    from parallel_runtime.models.families.wan.latent import WAN21, WAN22

    for ours, name in ((flux(16), "Flux"), (sd3(16), "SD3"), (pixart(4, True), "SD15"), (pixart(4, False), "SDXL")):
        comfy = _comfy(name)
        assert (ours.channels, ours.scale, ours.shift) == pytest.approx(
            (comfy["channels"], comfy["scale_factor"], comfy["shift_factor"])
        ), name
    for ours, name in ((WAN21, "Wan21"), (WAN22, "Wan22")):
        comfy = _comfy(name)
        assert ours.channels == comfy["channels"] and ours.scale == comfy["scale_factor"]
        assert list(ours.mean) == pytest.approx(comfy["latents_mean"], abs=1e-9)
        assert list(ours.std) == pytest.approx(comfy["latents_std"], abs=1e-9)


def test_no_engine_or_node_file_is_over_500_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in SCANNED if (n := len(p.read_text().splitlines())) > 500]
    assert not long, "split these files (one concept each, at most 500 lines):\n" + "\n".join(long)


def test_pyproject_description_names_every_family():
    """The Registry shows pyproject's description; a family landing without its label there leaves it stale
    (tests/comfyui/test_registry_pack.py reads it through comfy-cli; this is the quick check every family runs)."""
    import tomllib

    description = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["description"]
    missing = [spec.label for spec in FAMILIES if spec.label not in description]
    assert not missing, f"pyproject.toml's description does not name {missing}: add them to its Models list"


def test_a_family_newer_than_the_installed_diffusers_leaves_the_others_working(monkeypatch):
    """With a diffusers that lacks one family's class (an older release than the family needs), the other
    families' adapters still resolve and that family's class is a clear error naming diffusers' version."""
    import sys
    import types

    import diffusers

    from parallel_runtime.errors import ConfigError
    from parallel_runtime.models.registry import adapter_class_for, adapter_classes, diffusers_class

    newest = FAMILIES[-1].transformer_class
    older = types.ModuleType("diffusers")
    older.__version__ = "0.36.0"
    for spec in FAMILIES:
        for name in (spec.transformer_class, *spec.more_transformer_classes):
            if name != newest:
                setattr(older, name, getattr(diffusers, name))
    monkeypatch.setitem(sys.modules, "diffusers", older)
    table = adapter_classes()
    assert getattr(diffusers, newest) not in table and len(table) == len({*table})
    assert adapter_class_for(getattr(diffusers, FAMILIES[0].transformer_class)) is FAMILIES[0].adapter()
    with pytest.raises(ConfigError, match=f"diffusers 0.36.0 has no {newest}"):
        diffusers_class(newest)
