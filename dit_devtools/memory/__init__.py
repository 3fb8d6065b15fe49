"""Checks of the host's activation-memory estimate (``parallel_runtime.service.memory_checks``) against
what a device really allocates (``gpu_check``: one GPU, the FLUX.1 12B layout with random weights)."""
