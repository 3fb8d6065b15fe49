"""dit-parallel's development tools, kept out of the installed engine (``pip install .`` ships only
``parallel_runtime``); they live in the git checkout beside it, which is what ComfyUI-Manager clones.

- ``tiny``: random-weight tiny pipelines of every family, for tests, benchmarks and the loader's
  built-in ``tiny-*`` models (the trained ``tiny-flux-shapes`` ships with the engine);
- ``training``: how ``tiny-flux-shapes`` was trained and fine-tuned, its data, and the colour/shape
  detector its tests use as an oracle;
- ``faults``: the fault matrix (``bench soak`` and tests/test_fault_matrix.py) and its worker-side
  fault injection.

The engine reaches these through :func:`parallel_runtime.checkout.devtools_module`, which says what to do
when they are absent (an installed wheel without a checkout).
"""
