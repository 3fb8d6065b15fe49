"""dit-parallel's engine: one Flux.1, FLUX.2, SD3, PixArt, Qwen-Image or Wan 2.1/2.2 generation on several devices.

Importing this package imports nothing heavy. One wing (sub-package) per part of the architecture,
lowest layer first: ``parallel`` (config, mesh, collectives, layout planner), ``runtime`` (the worker
pool), ``attention`` (USP), ``models`` (adapters, loading), ``sampling`` (ComfyUI's sampler math),
``denoise`` (the denoise loop), ``pipefusion``, ``vae`` (parallel decode), ``service`` (the model API:
``parallel_runtime.service.api``) and ``tools`` (``python -m parallel_runtime --help``).
"""

__version__ = "0.1.0"
