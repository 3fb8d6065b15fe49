"""The solvers behind ComfyUI's sampler names, grouped by kind (docs/sampling.md §4); the table that
names them is ``sampling.samplers``."""
