"""The fault matrix: each fault on each rank in each phase (``matrix``), the full-/dev/shm cells run in
a private mount namespace (``shm_cells``), and the worker-side injection both use (``injection``)."""
