"""A ComfyUI SAMPLER (KSamplerSelect, SamplerEulerAncestral, SamplerDPMPP_2M_SDE, ...) read as the
Parallel Sampler's sampler name and noise options.

A SAMPLER is ComfyUI's ``KSAMPLER``: a sampling function plus ``extra_options`` (and ``inpaint_options``).
The function names the sampler (``sample_<name>`` of comfy.k_diffusion.sampling, the dpm_fast /
dpm_adaptive wrappers, UniPC's ``sample_unipc`` / ``sample_unipc_bh2``; ``ddim`` is euler with random
inpaint noise). ``eta`` / ``s_noise`` carry over where the sampler has them; DPM++ 2M SDE's
``solver_type`` picks the heun variant; any other option must hold ComfyUI's default value.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from ..errors import ConfigError

_NAMED_FUNCTIONS = {
    "dpm_fast_function": "dpm_fast",
    "dpm_adaptive_function": "dpm_adaptive",
    "sample_unipc": "uni_pc",
    "sample_unipc_bh2": "uni_pc_bh2",
}
NOISE_OPTIONS = ("eta", "s_noise")
_UNREADABLE = object()


def _name_of(function: Any, inpaint_options: dict) -> str:
    from ..sampling import SAMPLER_NAMES

    raw = getattr(function, "__name__", "")
    name = _NAMED_FUNCTIONS.get(raw, raw.removeprefix("sample_"))
    if name == "euler" and inpaint_options.get("random", False):
        name = "ddim"
    if name not in SAMPLER_NAMES or not (raw.startswith("sample_") or raw in _NAMED_FUNCTIONS):
        raise ConfigError(
            f"the SAMPLER input runs {getattr(function, '__module__', '?')}.{raw or function!r}",
            "the Parallel Sampler runs ComfyUI's own samplers by name (KSamplerSelect's list); a custom "
            "sampling function cannot run on the worker pool",
            "use KSamplerSelect (or a ComfyUI sampler node such as SamplerEulerAncestral), or pick sampler_name",
        )
    return name


def _defaults(function: Any) -> dict[str, Any]:
    try:
        return {k: p.default for k, p in inspect.signature(function).parameters.items() if p.default is not p.empty}
    except (TypeError, ValueError):
        return {}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a is b or a == b


def sampler_from_input(sampler: Any) -> tuple[str, dict[str, float]]:
    """(sampler name, {eta / s_noise: value}) of a ComfyUI SAMPLER, or a clear error."""
    from ..sampling import sampler_spec

    function = getattr(sampler, "sampler_function", None)
    if function is None:
        raise ConfigError(
            f"the SAMPLER input is a {type(sampler).__name__}",
            "a ComfyUI SAMPLER carries a sampling function and its options",
            "connect KSamplerSelect or another ComfyUI sampler node",
        )
    extra = dict(getattr(sampler, "extra_options", None) or {})
    name = _name_of(function, dict(getattr(sampler, "inpaint_options", None) or {}))
    solver_type = extra.pop("solver_type", "midpoint")
    if name in ("dpmpp_2m_sde", "dpmpp_2m_sde_gpu") and solver_type == "heun":
        name = name.replace("dpmpp_2m_sde", "dpmpp_2m_sde_heun")
    elif solver_type not in ("midpoint", "heun") or (solver_type == "heun" and not name.startswith("dpmpp_2m_sde")):
        raise ConfigError(
            f"solver_type={solver_type!r} for the {name} sampler",
            "only DPM++ 2M SDE has a solver type (midpoint or heun)",
            "use SamplerDPMPP_2M_SDE's midpoint or heun",
        )
    spec, defaults = sampler_spec(name), _defaults(function)
    options: dict[str, float] = {}
    for key, value in extra.items():
        if key in NOISE_OPTIONS and key in spec.options:
            options[key] = float(value)
        elif not _same(value, defaults.get(key, _UNREADABLE)):
            raise ConfigError(
                f"the SAMPLER sets {key}={value!r} for {name}",
                f"the Parallel Sampler takes a SAMPLER's sampler and its {' / '.join(spec.options) or 'no'} "
                f"noise options; {key} other than ComfyUI's default would be ignored",
                f"leave {key} at its default, or use ComfyUI's own SamplerCustom for this setting",
            )
    return name, options
