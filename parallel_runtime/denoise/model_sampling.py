"""The model sampling a generation runs with: the family's default or what a ModelSampling* node set.

``model_sampling_for(adapter, spec)`` is ComfyUI's ``model.get_model_object("model_sampling")``: the
spec the family declares for its file (``ModelPlan.model_sampling``) unless a node replaced it. The
``model_sampling_*_node`` functions are ComfyUI's ``ModelSamplingFlux`` / ``ModelSamplingSD3`` /
``ModelSamplingAuraFlow`` nodes (comfy_extras/nodes_model_advanced.py): same inputs, same math.
"""

from __future__ import annotations

from ..models.base import ModelAdapter
from ..models.sampling_spec import ModelSamplingSpec, discrete_flow_sampling, flux_sampling
from ..sampling import FluxFlowSampling, ModelSampling, discrete_eps, flow_sd3, flux_shift


def build_model_sampling(spec: ModelSamplingSpec) -> ModelSampling:
    """The sampling math of ``spec``."""
    if spec.kind == "flux_flow":
        return FluxFlowSampling(spec.shift)
    if spec.kind == "discrete_flow":
        return flow_sd3(spec.shift, spec.multiplier)
    return discrete_eps(spec.beta_schedule, spec.linear_start, spec.linear_end, spec.timesteps)


def model_sampling_for(adapter: ModelAdapter, spec: ModelSamplingSpec | None = None) -> ModelSampling:
    """``spec`` (a ModelSampling* node's), else the family's default for the loaded file."""
    return build_model_sampling(spec if spec is not None else adapter.plan.model_sampling)


def model_sampling_flux_node(max_shift: float, base_shift: float, width: int, height: int) -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingFlux: a Flux shift linear in the token count of ``width`` x ``height`` pixels
    (``base_shift`` at 256 tokens, ``max_shift`` at 4096)."""
    shift = flux_shift(int(width), int(height), float(base_shift), float(max_shift))
    source = f"Model Sampling Flux: max_shift {max_shift:g}, base_shift {base_shift:g}, {width}x{height}"
    return flux_sampling(shift, source)


def model_sampling_sd3_node(shift: float) -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingSD3: discrete flow with ``shift``, timesteps = sigma x 1000."""
    return discrete_flow_sampling(float(shift), 1000.0, f"Model Sampling SD3: shift {shift:g}")


def model_sampling_auraflow_node(shift: float) -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingAuraFlow: discrete flow with ``shift``, timesteps = sigma (multiplier 1)."""
    return discrete_flow_sampling(float(shift), 1.0, f"Model Sampling AuraFlow: shift {shift:g}")
