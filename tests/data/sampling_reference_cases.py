"""The cases make_comfy_sampling_reference.py runs through ComfyUI's samplers (data only).

Each case: model sampling (a key of the generator's models), sampler, scheduler, steps and optionally
denoise, img2img (start from a non-zero latent), eta / s_noise, cfg (default 1), negative (default True),
shape (default [1, 3, 6, 6]), noise ("generator": override the sampler's default noise sampler) and
end_at (KSamplerAdvanced's window that keeps the leftover noise).
"""

from __future__ import annotations

BATCH_SHAPE = [2, 3, 6, 6]
MATRIX_SHAPE = [1, 2, 4, 4]  # every sampler x three model samplings: kept small

MATRIX_MODELS = ("pixart", "sd3", "flux_768x1344")


def matrix_cases(names: list[str], schedulers: list[str]) -> list[dict]:
    """Every sampler on the three model samplings, the schedulers rotating so that each sampler meets
    three of them and each scheduler every kind of model; cfg 2.5 with a negative."""
    cases = []
    for k, name in enumerate(names):
        for m, model in enumerate(MATRIX_MODELS):
            scheduler = schedulers[(k + 3 * m) % len(schedulers)]
            cases.append(
                {"model": model, "sampler": name, "scheduler": scheduler, "steps": 5, "cfg": 2.5, "shape": MATRIX_SHAPE}
            )
    return cases


def extra_cases() -> list[dict]:
    """Options, img2img windows, cfg 1 with and without a negative for CFG++, batches, leftover noise."""
    m = {"shape": MATRIX_SHAPE, "cfg": 2.5}
    # fmt: off
    return [
        # the first samplers' cases of earlier references (6 steps, one network, 3x6x6)
        *[
            {"model": model, "sampler": name, "scheduler": scheduler, "steps": 6}
            for model, scheduler in (("pixart", "normal"), ("sd3", "simple"), ("flux_768x1344", "simple"))
            for name in ("euler", "euler_ancestral", "heun", "dpm_2", "dpmpp_2m", "dpmpp_2m_sde", "ddim", "lcm")
        ],
        {"model": "pixart", "sampler": "euler_ancestral", "scheduler": "karras", "steps": 7, "denoise": 0.6, "img2img": True},
        {"model": "pixart", "sampler": "lcm", "scheduler": "sgm_uniform", "steps": 4, "denoise": 0.7, "img2img": True},
        {"model": "sd3", "sampler": "dpmpp_2m_sde", "scheduler": "beta", "steps": 8, "denoise": 0.6, "img2img": True},
        {"model": "flux", "sampler": "euler_ancestral", "scheduler": "normal", "steps": 5, "denoise": 0.5, "img2img": True},
        {"model": "flux", "sampler": "heun", "scheduler": "beta", "steps": 5, "denoise": 0.8, "img2img": True},
        {"model": "sd3", "sampler": "dpm_2", "scheduler": "karras", "steps": 5, "denoise": 0.65, "img2img": True},
        {"model": "pixart", "sampler": "euler_ancestral", "scheduler": "normal", "steps": 6, "eta": 0.5, "s_noise": 0.8},
        {"model": "sd3", "sampler": "euler_ancestral", "scheduler": "simple", "steps": 6, "eta": 0.7, "s_noise": 1.1},
        {"model": "sd3", "sampler": "euler_ancestral", "scheduler": "simple", "steps": 6, "eta": 0.0},
        {"model": "flux", "sampler": "dpmpp_2m_sde", "scheduler": "simple", "steps": 6, "eta": 0.5, "s_noise": 0.9},
        {"model": "pixart", "sampler": "dpmpp_2m_sde", "scheduler": "karras", "steps": 6, "eta": 0.0},
        {"model": "pixart", "sampler": "dpmpp_2m_sde", "scheduler": "normal", "steps": 6, "noise": "generator"},
        {"model": "sd3", "sampler": "dpmpp_2m_sde", "scheduler": "simple", "steps": 6, "noise": "generator"},
        {"model": "flux_768x1344", "sampler": "dpmpp_2m_sde", "scheduler": "normal", "steps": 6, "noise": "generator", "eta": 0.8},
        {"model": "pixart", "sampler": "euler_ancestral", "scheduler": "karras", "steps": 5, "shape": BATCH_SHAPE},
        {"model": "sd3", "sampler": "dpmpp_2m_sde", "scheduler": "simple", "steps": 5, "shape": BATCH_SHAPE},
        {"model": "flux", "sampler": "lcm", "scheduler": "simple", "steps": 4, "shape": BATCH_SHAPE},
        # the newer samplers' options and windows
        {**m, "model": "pixart", "sampler": "dpmpp_sde", "scheduler": "karras", "steps": 5, "eta": 0.7, "s_noise": 0.8},
        {**m, "model": "sd3", "sampler": "seeds_2", "scheduler": "simple", "steps": 5, "eta": 0.5},
        {**m, "model": "flux", "sampler": "seeds_3", "scheduler": "beta", "steps": 4, "eta": 0.6, "s_noise": 1.2},
        {**m, "model": "sd3", "sampler": "er_sde", "scheduler": "normal", "steps": 6, "s_noise": 0.5},
        {**m, "model": "pixart", "sampler": "sa_solver", "scheduler": "exponential", "steps": 7, "s_noise": 0.7},
        {**m, "model": "flux", "sampler": "res_multistep_ancestral", "scheduler": "simple", "steps": 5, "eta": 0.6},
        {**m, "model": "pixart", "sampler": "euler_ancestral_cfg_pp", "scheduler": "karras", "steps": 5, "eta": 0.4},
        {**m, "model": "sd3", "sampler": "dpmpp_3m_sde", "scheduler": "sgm_uniform", "steps": 6, "eta": 0.0},
        {**m, "model": "pixart", "sampler": "uni_pc", "scheduler": "normal", "steps": 8, "denoise": 0.6, "img2img": True},
        {**m, "model": "flux", "sampler": "deis", "scheduler": "simple", "steps": 7, "denoise": 0.7, "img2img": True},
        {**m, "model": "sd3", "sampler": "ipndm_v", "scheduler": "karras", "steps": 8},
        {**m, "model": "pixart", "sampler": "lms", "scheduler": "karras", "steps": 9},
        {**m, "model": "flux_768x1344", "sampler": "dpm_fast", "scheduler": "simple", "steps": 9},
        {**m, "model": "sd3", "sampler": "dpm_fast", "scheduler": "normal", "steps": 8},
        {**m, "model": "flux", "sampler": "uni_pc_bh2", "scheduler": "simple", "steps": 1},
        {**m, "model": "pixart", "sampler": "uni_pc", "scheduler": "karras", "steps": 2},
        {**m, "model": "sd3", "sampler": "sa_solver_pece", "scheduler": "beta", "steps": 2},
        # CFG++ at cfg 1 evaluates the negative anyway; without a negative its prediction is 0
        {**m, "model": "sd3", "sampler": "euler_cfg_pp", "scheduler": "simple", "steps": 5, "cfg": 1.0},
        {**m, "model": "pixart", "sampler": "dpmpp_2m_cfg_pp", "scheduler": "karras", "steps": 5, "cfg": 1.0},
        {**m, "model": "flux", "sampler": "res_multistep_cfg_pp", "scheduler": "simple", "steps": 5, "cfg": 1.0, "negative": False},
        {**m, "model": "sd3", "sampler": "gradient_estimation_cfg_pp", "scheduler": "beta", "steps": 5, "cfg": 1.0, "negative": False},
        # batches share one Brownian tree / generator
        {**m, "model": "sd3", "sampler": "dpmpp_3m_sde", "scheduler": "simple", "steps": 5, "shape": [2, 2, 4, 4]},
        {**m, "model": "pixart", "sampler": "seeds_3", "scheduler": "karras", "steps": 4, "shape": [2, 2, 4, 4]},
        # a KSamplerAdvanced pass that stops early and keeps its leftover noise
        {**m, "model": "sd3", "sampler": "sa_solver", "scheduler": "simple", "steps": 6, "end_at": 4},
        {**m, "model": "pixart", "sampler": "heunpp2", "scheduler": "karras", "steps": 6, "end_at": 4},
        {**m, "model": "flux", "sampler": "uni_pc", "scheduler": "simple", "steps": 6, "end_at": 4},
        {**m, "model": "sd3", "sampler": "dpm_fast", "scheduler": "simple", "steps": 6, "end_at": 4},
        {**m, "model": "pixart", "sampler": "dpm_adaptive", "scheduler": "karras", "steps": 6, "end_at": 4},
    ]
    # fmt: on
