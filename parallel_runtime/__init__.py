"""dit-parallel's engine: run one diffusion-transformer generation across several devices.

Importing this package imports nothing heavy; see ``parallel_runtime.api`` (load, encode, sample,
decode), ``parallel_runtime.host`` (the worker pool) and ``python -m parallel_runtime --help``.
"""

__version__ = "0.1.0"
