"""The denoise loop: a model adapter driven by ComfyUI sampler math, with CFG and sequence parallelism."""
