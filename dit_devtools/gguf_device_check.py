"""GGUF on a device (the GPU check's GGUF step): Qwen-Image-shaped Q8_0 and Q4_K files loaded on ``--device``, their
GGML blocks held there and dequantised there, layer by layer, at each call; the step time over the same model's
bf16 file.

    python -m dit_devtools.gguf_device_check [--device cuda] [--quick] [--json PATH]

Checks (exit status 1 when one fails): every quantised Linear keeps its uint8 blocks on the device (nothing
dequantised at load); each layer's weight dequantised on the device equals the same blocks dequantised on the
CPU (within 2e-3 of its largest value: two float16 steps, the default arithmetic's products); the model's forward on the device equals the CPU's
float32 forward within the compute dtype's rounding. On CUDA it also reports the memory the loaded model takes
(the GGML bytes, not a dequantised copy). ``--device cpu`` runs every step without a GPU (tests run it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.single_file import load_single_file_transformer
from parallel_runtime.tools.bench_gguf import qwen_tensors, step_seconds, write_qwen_bf16, write_qwen_gguf

QUANTS = ("Q8_0", "Q4_K")
# (width, blocks, image tokens) checked against the CPU, and (width, blocks, image tokens, rounds) timed
SIZES = {"quick": ((256, 1, 64), (256, 1, 64, 2)), "full": ((1024, 1, 256), (3072, 1, 4096, 10))}
DEQUANT_TOLERANCE = 2e-3  # a wrong unpacking is off by the whole scale, not by a rounding
FORWARD_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}  # relative L2 against the CPU's float32 forward


def _inputs(width: int, tokens: int, device: str, dtype: torch.dtype) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    side = int(tokens**0.5)
    return dict(
        hidden_states=torch.randn(1, side * side, 64, generator=gen).to(device, dtype),
        encoder_hidden_states=torch.randn(1, 32, width, generator=gen).to(device, dtype),
        encoder_hidden_states_mask=torch.ones(1, 32, dtype=torch.long, device=device),
        timestep=torch.tensor([0.5], device=device, dtype=dtype),
        img_shapes=[[(1, side, side)]],
    )


def check_file(path: Path, width: int, tokens: int, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """One GGUF file on ``device`` against the CPU: where its blocks live, its dequantisation, its forward."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(device)
    model = load_single_file_transformer(path, device, dtype)[0]
    loaded_bytes = torch.cuda.memory_allocated(device) - before if cuda else None
    reference = load_single_file_transformer(path, "cpu", torch.float32)[0]
    layers, cpu_layers = gguf_layers(model), gguf_layers(reference)
    packed = {name: layer for name, layer in layers.items() if layer.kind.packed}
    on_device = all(
        layer.weight.device.type == torch.device(device).type and layer.weight.dtype == torch.uint8
        for layer in packed.values()
    )
    worst = 0.0
    with torch.no_grad():
        for name, layer in packed.items():
            here = layer.dequantised(torch.float32).cpu()
            there = cpu_layers[name].dequantised(torch.float32)
            worst = max(worst, float((here - there).abs().max() / there.abs().max().clamp_min(1e-30)))
        got = model(**_inputs(width, tokens, device, dtype)).sample.float().cpu()
        want = reference(**_inputs(width, tokens, "cpu", torch.float32)).sample
    forward_error = float((got - want).norm() / want.norm())
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "quantised_layers": len(packed),
        "kinds": sorted({layer.kind.name for layer in packed.values()}),
        "blocks_on_device": on_device,
        "dequant_max_rel_diff_vs_cpu": worst,
        "forward_rel_error_vs_cpu_fp32": forward_error,
        "held_bytes": held,
        "device_bytes_after_load": loaded_bytes,
        "ok": bool(packed) and on_device and worst <= DEQUANT_TOLERANCE and forward_error <= FORWARD_TOLERANCE[dtype],
    }


def run(device: str, quick: bool) -> dict[str, Any]:
    """Check and time the Q8_0 and Q4_K files on ``device`` (bf16 compute on CUDA, float32 on the CPU)."""
    (width, blocks, tokens), (t_width, t_blocks, t_tokens, rounds) = SIZES["quick" if quick else "full"]
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    label = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "CPU"
    results: dict[str, Any] = {
        "model": f"Qwen-Image-shaped transformers, random weights (Q4_K: random valid blocks), "
        f"{str(dtype).removeprefix('torch.')} compute on {device} ({label}); checked: {blocks} block {width} wide, "
        f"{tokens} image + 32 text tokens; timed: {t_blocks} block {t_width} wide, {t_tokens} + 32 tokens",
        "baseline": "the CPU's float32 run of the same file; the step of the same model's bf16 .safetensors file "
        "(weights upcast once, at load)",
        "files": {},
    }
    with tempfile.TemporaryDirectory(prefix="gguf-device-") as tmp:
        for quant in QUANTS:
            path = write_qwen_gguf(Path(tmp) / f"check_{quant}.gguf", qwen_tensors(width, blocks, seed=1), quant)
            results["files"][quant] = check_file(path, width, tokens, device, dtype)
            path.unlink()
        paths = {"bf16": write_qwen_bf16(Path(tmp) / "qwen_image_bf16.safetensors", t_width, t_blocks, 1)}
        for quant in QUANTS:
            tensors = qwen_tensors(t_width, t_blocks, seed=1)
            paths[quant] = write_qwen_gguf(Path(tmp) / f"qwen_image_{quant}.gguf", tensors, quant)
        times = step_seconds(paths, t_width, t_tokens, rounds, device, dtype)
    medians = {name: statistics.median(t) for name, t in times.items()}
    results["step_seconds"] = {name: round(s, 5) for name, s in medians.items()}
    results["step_over_bf16"] = {q: round(medians[q] / medians["bf16"], 3) for q in QUANTS}
    results["ok"] = all(f["ok"] for f in results["files"].values())
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a tiny model (seconds on a CPU)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    results = run(args.device, args.quick)
    print(results["model"])
    for quant, f in results["files"].items():
        print(
            f"  {quant}: {f['quantised_layers']} quantised layers {f['kinds']}, blocks on {args.device}: "
            f"{f['blocks_on_device']}, dequant vs CPU {f['dequant_max_rel_diff_vs_cpu']:.1e}, forward vs CPU fp32 "
            f"{f['forward_rel_error_vs_cpu_fp32']:.1e}, held {f['held_bytes'] / 2**20:.1f} MiB -> "
            f"{'ok' if f['ok'] else 'FAILED'}"
        )
    steps = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in results["step_seconds"].items())
    print(f"  step: {steps}; over bf16: {results['step_over_bf16']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
