"""Attention kernels behind one registry with constraints: torch SDPA, flash-attn (FlashAttention 2),
FlashAttention 3, SageAttention and cuDNN SDPA (the CUDA ones in ``gpu_kernels.py``).

Every kernel offers two calls on q, k, v of shape [B, H, S, D]:
- ``attend(q, k, v, scale)`` -> out, the plain attention (used when no partial results are merged);
- ``attend_lse(q, k, v, scale)`` -> (out, lse), lse = logsumexp of the scaled scores over the keys,
  shape [B, H, S_q], float32 (float64 for float64 inputs); used by Ring attention to merge blocks.

A kernel declares where it can run (device types, CUDA compute capability, dtypes, largest head dim, a
module it needs); :func:`select_kernel` checks those constraints and says what to change when they are not
met. Backend "auto" takes the first kernel of :func:`auto_order` for the device that can run (exact kernels
only: SageAttention quantises Q.K^T to INT8, so it runs only when named); :func:`describe_choice` says which
kernel a backend resolves to on a device and why.
CUDA paths are guarded: if a fused op refuses an input, SDPA falls back to the next op and finally
to a plain matmul + logsumexp, which runs anywhere.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from .gpu_kernels import cudnn_attend, cudnn_attend_lse, flash3_attend, flash3_attend_lse, sage_attend

AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float | None], torch.Tensor]
AttendLseFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float | None], tuple[torch.Tensor, torch.Tensor]]

FLASH_INSTALL_HINT = (
    "install flash-attn into the Python that runs ComfyUI: `pip install flash-attn --no-build-isolation` "
    "(or `pip install 'dit-parallel[gpu]'`), or choose backend 'sdpa' (or 'auto')"
)
FLASH3_INSTALL_HINT = (
    "build FlashAttention 3 (flash-attn's hopper/ folder: `cd flash-attention/hopper && python setup.py install`) "
    "into the Python that runs ComfyUI, or choose backend 'sdpa' (or 'auto')"
)
SAGE_INSTALL_HINT = "`pip install sageattention` (it needs triton) into the Python that runs ComfyUI, or choose 'sdpa'"

_MANUAL_CHUNK_ELEMENTS = 1 << 26
"""Largest score matrix (elements) the manual kernel materialises at once; larger queries are chunked."""


# -- helpers -------------------------------------------------------------------------------------
def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _default_scale(q: torch.Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def _empty_result(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Result for degenerate shapes (no queries, heads or keys), which several fused kernels crash on."""
    b, h, sq = q.shape[0], q.shape[1], q.shape[2]
    if b and h and sq and k.shape[2]:
        return None
    out = q.new_zeros((b, h, sq, v.shape[-1]))
    lse = torch.full((b, h, sq), float("-inf"), dtype=_lse_dtype(q.dtype), device=q.device)
    return out, lse


def manual_attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel: softmax(q k^T * scale) v and its logsumexp, computed in float32 or wider.

    Runs on any device and dtype; queries are processed in chunks to bound the score matrix."""
    empty = _empty_result(q, k, v)
    if empty is not None:
        return empty
    acc = torch.promote_types(q.dtype, torch.float32)
    s = _default_scale(q, scale)
    kt = k.to(acc).transpose(-2, -1)
    vv = v.to(acc)
    rows = max(1, _MANUAL_CHUNK_ELEMENTS // max(1, q.shape[0] * q.shape[1] * k.shape[2]))
    outs, lses = [], []
    for qc in torch.split(q, rows, dim=2):
        scores = torch.matmul(qc.to(acc), kt) * s
        lse = torch.logsumexp(scores, dim=-1)
        outs.append(torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vv))
        lses.append(lse)
    return torch.cat(outs, dim=2).to(q.dtype), torch.cat(lses, dim=2).to(_lse_dtype(q.dtype))


# -- torch SDPA ----------------------------------------------------------------------------------
def sdpa_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention (torch picks its fastest fused kernel)."""
    empty = _empty_result(q, k, v)
    if empty is not None:
        return empty[0]
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def _sdpa_lse_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None):
    """torch's CUDA flash kernel (fp16/bf16, head dim <= 256), else its memory-efficient kernel."""
    same_dims = q.shape[-1] == k.shape[-1] == v.shape[-1]
    if same_dims and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
        try:
            res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
            return res[0], res[1]
        except (RuntimeError, NotImplementedError):
            pass  # e.g. a GPU older than sm80: try the next kernel
    try:
        res = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=scale)
        # The efficient kernel pads the lse along the query axis (to a multiple of 32).
        return res[0], res[1][..., : q.shape[2]]
    except (RuntimeError, NotImplementedError):
        return None


def sdpa_attend_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention plus logsumexp from torch's own fused kernels, falling back to the manual kernel."""
    empty = _empty_result(q, k, v)
    if empty is not None:
        return empty
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if q.device.type == "cpu":
        try:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)
            return out, lse
        except (RuntimeError, NotImplementedError):
            pass  # e.g. different head dims for q/k and v
    elif q.device.type == "cuda":
        res = _sdpa_lse_cuda(q, k, v, scale)
        if res is not None:
            return res[0], res[1].to(_lse_dtype(q.dtype))
    return manual_attention_lse(q, k, v, scale)


def _lse_or_sdpa(kernel_lse: Callable[..., tuple[torch.Tensor, torch.Tensor] | None]) -> AttendLseFn:
    """A kernel's attention with logsumexp, or torch SDPA's for the calls where it has none."""

    def attend_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None):
        return kernel_lse(q, k, v, scale) or sdpa_attend_lse(q, k, v, scale)

    return attend_lse


# -- flash-attn ----------------------------------------------------------------------------------
def try_import(name: str) -> tuple[types.ModuleType | None, str]:
    """Import a package; returns (module, "") or (None, why it failed)."""
    try:
        return importlib.import_module(name), ""
    except Exception as exc:  # a broken CUDA extension raises OSError etc., not only ImportError
        return None, f"{type(exc).__name__}: {exc}"


def flash_attend_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attn.flash_attn_func (layout [B, S, H, D]) with its softmax logsumexp."""
    empty = _empty_result(q, k, v)
    if empty is not None:
        return empty
    from flash_attn import flash_attn_func  # availability was checked by select_kernel

    res = flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, return_attn_probs=True
    )
    out, lse = res[0], res[1]
    return out.transpose(1, 2), lse[..., : q.shape[2]].float()


def flash_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """flash_attn.flash_attn_func without the logsumexp."""
    empty = _empty_result(q, k, v)
    if empty is not None:
        return empty[0]
    from flash_attn import flash_attn_func

    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale)
    return out.transpose(1, 2)


# -- registry ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AttentionKernel:
    """One attention kernel and the inputs it accepts."""

    name: str
    description: str
    attend: AttendFn
    attend_lse: AttendLseFn
    devices: frozenset[str] | None = None  # device types; None: any
    dtypes: frozenset[torch.dtype] | None = None  # None: any floating dtype
    max_head_dim: int | None = None
    module: str | None = None  # a package that must import
    install_hint: str = ""
    min_capability: tuple[int, int] | None = None  # CUDA compute capability it needs (e.g. (9, 0) for Hopper)
    exact: bool = True  # False: quantised (SageAttention), never chosen by "auto"

    def device_problem(
        self, device: torch.device, capability: tuple[int, int] | None = None
    ) -> tuple[str, str, str] | None:
        """(what, why, fix) when this kernel cannot run on ``device`` at all, else None. ``capability``: the
        CUDA device's compute capability (read from the device when None)."""
        if self.devices is not None and device.type not in self.devices:
            return (
                f"attention backend {self.name!r} cannot run on device {device}",
                f"{self.description} runs only on {'/'.join(sorted(self.devices))} devices; this rank computes on "
                f"{device.type}",
                "choose backend 'sdpa', or 'auto' (it picks the fastest kernel that can run on each device)",
            )
        have = capability or cuda_capability(device)
        known = device.type == "cuda" and have != (0, 0)  # (0, 0): no GPU visible here to ask
        if self.min_capability is not None and known and have < self.min_capability:
            need = ".".join(map(str, self.min_capability))
            return (
                f"attention backend {self.name!r} needs a GPU of compute capability {need} or newer; "
                f"{device} is {'.'.join(map(str, have))}",
                f"{self.description} uses instructions of newer GPUs",
                "choose backend 'auto' or 'sdpa'",
            )
        if self.module is not None and device.type == "cuda":
            module, reason = try_import(self.module)
            if module is None:
                return (
                    f"attention backend {self.name!r} was requested but the {self.module} package cannot be "
                    f"imported ({reason})",
                    f"{self.description} is a separate package with compiled CUDA kernels",
                    self.install_hint,
                )
        return None

    def input_problem(self, dtype: torch.dtype, head_dim: int, v_head_dim: int) -> tuple[str, str, str] | None:
        """(what, why, fix) when this kernel does not accept such inputs, else None."""
        if self.dtypes is not None and dtype not in self.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return (
                f"attention backend {self.name!r} got {str(dtype).removeprefix('torch.')} inputs",
                f"{self.description} supports only {names}",
                f"run the model in {names}, or choose backend 'sdpa' or 'auto'",
            )
        if self.max_head_dim is not None and max(head_dim, v_head_dim) > self.max_head_dim:
            return (
                f"attention backend {self.name!r} got head dim {max(head_dim, v_head_dim)}",
                f"{self.description} supports head dims up to {self.max_head_dim}",
                "choose backend 'sdpa' or 'auto'",
            )
        if self.devices is not None and head_dim != v_head_dim:
            return (
                f"attention backend {self.name!r} got different head dims for q/k ({head_dim}) and v ({v_head_dim})",
                f"{self.description} needs one head dim for q, k and v",
                "choose backend 'sdpa' or 'auto'",
            )
        return None


KERNELS: types.MappingProxyType[str, AttentionKernel] = types.MappingProxyType(
    {
        "sdpa": AttentionKernel(
            name="sdpa",
            description="torch scaled_dot_product_attention",
            attend=sdpa_attend,
            attend_lse=sdpa_attend_lse,
        ),
        "flash": AttentionKernel(
            name="flash",
            description="flash-attn (FlashAttention-2)",
            attend=flash_attend,
            attend_lse=flash_attend_lse,
            devices=frozenset({"cuda"}),
            dtypes=frozenset({torch.float16, torch.bfloat16}),
            max_head_dim=256,
            module="flash_attn",
            install_hint=FLASH_INSTALL_HINT,
            min_capability=(8, 0),
        ),
        "flash3": AttentionKernel(
            name="flash3",
            description="FlashAttention 3 (flash_attn_interface, Hopper)",
            attend=flash3_attend,
            attend_lse=_lse_or_sdpa(flash3_attend_lse),
            devices=frozenset({"cuda"}),
            dtypes=frozenset({torch.float16, torch.bfloat16}),
            max_head_dim=256,
            module="flash_attn_interface",
            install_hint=FLASH3_INSTALL_HINT,
            min_capability=(9, 0),
        ),
        "sage": AttentionKernel(
            name="sage",
            description="SageAttention (sageattention: INT8 Q.K^T, lossy)",
            attend=sage_attend,
            attend_lse=sdpa_attend_lse,  # no logsumexp output: Ring blocks merge through torch SDPA
            devices=frozenset({"cuda"}),
            dtypes=frozenset({torch.float16, torch.bfloat16}),
            max_head_dim=128,
            module="sageattention",
            install_hint=SAGE_INSTALL_HINT,
            min_capability=(8, 0),
            exact=False,
        ),
        "cudnn": AttentionKernel(
            name="cudnn",
            description="cuDNN attention through torch SDPA",
            attend=cudnn_attend,
            attend_lse=_lse_or_sdpa(cudnn_attend_lse),
            devices=frozenset({"cuda"}),
            dtypes=frozenset({torch.float16, torch.bfloat16}),
            max_head_dim=128,
            min_capability=(8, 0),
        ),
    }
)
"""Kernels by backend name. Read-only."""


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of a CUDA device, (0, 0) for any other device (or when no GPU is visible)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return (0, 0)
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def auto_order(device: torch.device, capability: tuple[int, int] | None = None) -> tuple[tuple[str, ...], str]:
    """(preference of backend "auto" on ``device``, why). Hopper: FlashAttention 3, else torch SDPA (which runs
    cuDNN attention there, faster than FlashAttention 2); Ampere / Ada: flash-attn 2, else torch SDPA (its own
    FlashAttention 2); anything else: torch SDPA."""
    if device.type != "cuda":
        return ("sdpa",), f"torch SDPA on {device.type}"
    cap = capability or cuda_capability(device)
    where = f"CUDA sm{cap[0]}{cap[1]}"
    if cap >= (9, 0):
        return ("flash3", "sdpa"), f"{where}: FlashAttention 3 when installed, else torch SDPA (cuDNN attention)"
    if cap >= (8, 0):
        return ("flash", "sdpa"), f"{where}: flash-attn 2 when installed, else torch SDPA"
    return ("sdpa",), f"{where}: torch SDPA (the fused kernels need sm80)"


def backend_names() -> tuple[str, ...]:
    """Every valid backend name: "auto" and the registered kernels."""
    return ("auto", *KERNELS)


def check_backend_name(name: str) -> str:
    """Return ``name`` if it is a valid backend; otherwise raise ConfigError listing the choices."""
    if name not in backend_names():
        raise ConfigError(
            f"unknown attention backend {name!r}",
            "the backend picks the attention kernel and only these exist: "
            + "; ".join(f"{k!r} ({v.description})" for k, v in KERNELS.items())
            + "; 'auto' (the fastest exact kernel the device can run: FlashAttention 3 on Hopper, flash-attn 2 on "
            "Ampere / Ada when installed, else torch SDPA)",
            f"use one of: {', '.join(backend_names())}",
        )
    return name


def usable_backends(device: torch.device, capability: tuple[int, int] | None = None) -> tuple[str, ...]:
    """Kernels that can run on ``device`` (checks device type, compute capability and importable packages; may
    import them)."""
    return tuple(name for name, kernel in KERNELS.items() if kernel.device_problem(device, capability) is None)


def describe_choice(backend: str, device: torch.device, capability: tuple[int, int] | None = None) -> str:
    """Which kernel ``backend`` runs on ``device`` (for inputs every kernel accepts) and why, e.g.
    "sdpa (auto, CUDA sm90: ...; flash3 not available: ...)"."""
    check_backend_name(backend)
    device = torch.device(device)
    if backend != "auto":
        problem = KERNELS[backend].device_problem(device, capability)
        return backend if problem is None else f"{backend} cannot run here: {problem[0]}"
    order, why = auto_order(device, capability)
    usable = usable_backends(device, capability)
    chosen = next(name for name in order if name in usable or name == "sdpa")
    skipped = []
    for name in order[: order.index(chosen)]:
        problem = KERNELS[name].device_problem(device, capability)
        skipped.append(f"; {name} not available: {problem[0] if problem else 'refused'}")
    return f"{chosen} (auto, {why}{''.join(skipped)})"


def check_backend_device(name: str, device: torch.device) -> None:
    """Raise ConfigError if the explicitly named backend cannot run on ``device``."""
    check_backend_name(name)
    if name != "auto":
        problem = KERNELS[name].device_problem(torch.device(device))
        if problem is not None:
            raise ConfigError(*problem)


def select_kernel(
    backend: str,
    q: torch.Tensor,
    v: torch.Tensor,
    usable: tuple[str, ...],
) -> AttentionKernel:
    """Kernel for these inputs. ``usable``: backends that can run on this device (see
    :func:`usable_backends`). An explicit backend that does not accept the inputs raises ConfigError;
    "auto" takes the first kernel of :func:`auto_order` that does."""
    names = auto_order(q.device)[0] if backend == "auto" else (backend,)
    for name in names:
        kernel = KERNELS[name]
        if name not in usable:
            if backend == "auto":
                continue
            problem = kernel.device_problem(q.device) or (
                f"attention backend {name!r} cannot run on device {q.device}",
                "its constraints were not met when the attention was built",
                "choose backend 'sdpa' or 'auto'",
            )
            raise ConfigError(*problem)
        problem = kernel.input_problem(q.dtype, q.shape[-1], v.shape[-1])
        if problem is None:
            return kernel
        if backend != "auto":
            raise ConfigError(*problem)
    return KERNELS["sdpa"]
