"""A sampling job's activation memory per rank, estimated on the host before the job is sent, and checked
against what the devices have free (CPU ranks: the machine's available RAM, shared by all of them).

Every size ComfyUI's inputs allow passes the value checks, but a 16384 x 16384 image is a million tokens:
its activations need tens of GiB per rank, and a worker that runs out is killed by the OOM killer (CPU) or
fails with CUDA out of memory after minutes of work. The estimate follows the plan:

* each rank's share of the token sequence (image tokens of the latent, plus the text tokens) runs through
  the blocks: ``BLOCK_VECTORS`` vectors of the model's width per token are alive at a block's peak
  (q, k, v, the attention output, the MLP's hidden layer, the residual stream), in the compute dtype,
  for every item the forward batches (a batch, times 2 for CFG run as one batch);
* the whole sequence's embeddings before they are split over the sequence-parallel ranks:
  ``EMBED_VECTORS`` vectors of the width per token;
* the sampler's state, in float32: ``LATENT_COPIES`` copies of the latent (x, noise, the prediction,
  the sampler's history, their model-space forms);
* sequence parallel ranks: ``SP_GATHER_VECTORS`` vectors of the width per token of the whole sequence for
  the exchange buffers (all-to-all inputs and outputs, the gathered output before unpatchify);
* PipeFusion: the stage's blocks keep the K and V of every token (stale K/V), and a patch's tokens
  run at once instead of the whole sequence.

The constants were fitted to the bytes torch itself allocates at the peak of one step (the profiler's
memory records, tests/test_job_memory.py) on tiny-flux at 16,896 tokens: 1 rank, Ulysses 2, batched CFG.
Peak RSS is not the oracle: it adds the C allocator's and the CPU kernels' scratch, which differed by
70 MiB between this machine and CI's for the same step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..denoise.entries import Branch
from ..errors import ConfigError
from ..parallel.config import ParallelConfig
from .load_request import LoadRequest

BLOCK_VECTORS = 12
EMBED_VECTORS = 7
SP_GATHER_VECTORS = 10
LATENT_COPIES = 5
KV_VECTORS = 2
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GIB = 2**30


def sampling_bytes_per_rank(
    info: dict[str, Any],
    config: ParallelConfig,
    latent_shape: Sequence[int],
    text_tokens: int,
    batched_cfg: bool,
    dtype: str,
    patches: int | None = None,
) -> int:
    """Bytes of activations one rank holds at the peak of a denoising step (see the module doc).
    ``info``: the model's load info (patch_size, inner_dim, num_blocks); ``latent_shape``: the raw
    latent [B, C, (T,) H, W]; ``batched_cfg``: the positive and negative run as one batch."""
    p = int(info.get("patch_size", 2))
    width = int(info.get("inner_dim") or 0)
    batch, spatial = int(latent_shape[0]), [int(s) for s in latent_shape[2:]]
    frames = spatial[0] if len(spatial) == 3 else 1
    image_tokens = frames * math.ceil(spatial[-2] / p) * math.ceil(spatial[-1] / p)
    latent_values = math.prod(latent_shape[1:])  # per batch item
    tokens = image_tokens + int(text_tokens)
    forward_batch = batch * (2 if batched_cfg else 1)
    compute = DTYPE_BYTES.get(dtype, 4)
    sp = config.sp_degree
    running = tokens if config.pp <= 1 else math.ceil(tokens / max(patches or config.pp, config.pp))
    blocks = math.ceil(tokens / sp) if config.pp <= 1 else math.ceil(running / sp)
    gather = SP_GATHER_VECTORS * tokens if sp > 1 else 0
    out = forward_batch * width * compute * (BLOCK_VECTORS * blocks + EMBED_VECTORS * running + gather)
    if config.pp > 1:
        stage_blocks = math.ceil(int(info.get("num_blocks", 1)) / config.pp)
        out += forward_batch * width * compute * KV_VECTORS * stage_blocks * math.ceil(tokens / sp)
    return out + batch * latent_values * 4 * LATENT_COPIES


def text_tokens_of(*branches: Branch | None) -> int:
    """The most text tokens of any conditioning entry of ``branches``."""
    return max((e.cond.prompt_embeds.shape[1] for b in branches if b for e in b), default=0)


def available_ram() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_room(
    needed: int, devices: Sequence[str], free_on_gpus: Callable[[], list[int]], what: str, family: str
) -> None:
    """Raise ConfigError when ``needed`` bytes per rank do not fit: CPU ranks share the machine's
    available RAM; a GPU rank has its own free memory (``free_on_gpus()``: one number per rank, asked
    of the workers only when the job is big enough to matter)."""
    if all(d == "cpu" for d in devices):
        room = available_ram()
        total = needed * len(devices)
        if room is None or total <= room:
            return
        where = f"the {len(devices)} CPU ranks need {total / GIB:.1f} GiB together, the machine has {room / GIB:.1f} GiB available"
    else:
        if needed < GIB // 4:
            return  # far below any GPU's spare room: not worth a round trip
        free = free_on_gpus()
        short = [(rank, f) for rank, f in enumerate(free) if f < needed]
        if not short:
            return
        rank, room = min(short, key=lambda item: item[1])
        where = f"rank {rank} ({devices[rank]}) has {room / GIB:.1f} GiB free"
    raise ConfigError(
        f"{what} needs about {needed / GIB:.1f} GiB of activations per rank, but {where}",
        f"a denoising step of the {family} model holds its tokens (the image's and the prompt's) times the "
        "model's width at every block; past the free memory a worker is killed (out of memory) after minutes",
        "make the image or the batch smaller, spread the tokens over more devices (Ulysses / Ring degree), "
        "compute in bf16, or free memory on the devices",
    )


def free_for_torch(memory: dict[str, int]) -> int:
    """A GPU rank's room for new tensors from its memory report: the device's free memory plus what
    torch's cache holds unused."""
    return memory["free_bytes"] + memory.get("reserved_bytes", 0) - memory.get("allocated_bytes", 0)


def check_sampling_memory(
    info: dict[str, Any],
    config: ParallelConfig,
    request: LoadRequest,
    devices: Sequence[str],
    shape: Sequence[int],
    branches: tuple[Branch, Branch | None],
    free_on_gpus: Callable[[], list[int]],
) -> None:
    """ConfigError when sampling a latent of ``shape`` with ``branches`` (the negative None when the
    sampler does not use it) needs more activation memory per rank than the devices have free."""
    positive, negative = branches
    batched_cfg = negative is not None and config.cfg == 1
    tokens = text_tokens_of(positive, negative)
    needed = sampling_bytes_per_rank(info, config, shape, tokens, batched_cfg, request.dtype, request.pp_patches)
    check_room(needed, devices, free_on_gpus, f"sampling a {list(shape)} latent", str(info.get("family", "")))
