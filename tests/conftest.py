"""Session-wide fixtures: persistent CPU worker pools (gloo) shared by every test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.pools import PoolRegistry

torch.set_num_threads(1)
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
# Jobs in tests/dist_jobs are submitted as functions of the package tests.dist_jobs, which the workers
# import from the repository root (their PYTHONPATH): make the same name importable here.
ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def pool_registry():
    registry = PoolRegistry(max_pools=3)
    yield registry
    registry.close_all()


@pytest.fixture(scope="session")
def cpu_pool(pool_registry):
    """``cpu_pool(ParallelConfig(...))`` -> a warm WorkerPool with one CPU rank per mesh position,
    one thread each. Pools are kept for the session (at most 3 alive; the least recently used
    one is closed when a fourth is needed)."""

    def get(config: ParallelConfig, threads: int = 1):
        return pool_registry.get(f"cpu:{config.world_size}", config, threads_per_worker=threads)

    return get


@pytest.fixture
def fake_ctx():
    """A node context without workers whose bridge records what the nodes tell ComfyUI (tests/node_helpers.py)."""
    from node_helpers import fake_context

    return fake_context()


@pytest.fixture(scope="module")
def tiny_transformers():
    """family -> the tiny diffusers transformer of flux, sd3 and pixart (tests/original_layout_files.py)."""
    from original_layout_files import tiny_transformers as load

    return load()
