#!/usr/bin/env bash
# The GPU check, for a bare machine with one CUDA GPU (torch installed, no internet), in under 8 minutes.
#
#   dit_devtools/gpu_check.sh fetch   # here, with PyPI reachable: the wheels the bare image lacks -> .whl/
#   dit_devtools/gpu_check.sh run     # there (bring .whl/ along): install them, CUDA tests, bench gpu, bench gpu-speed
#
# `bash dit_devtools/gpu_check.sh` (from the checkout's root) is `run`. It installs each wheel of .whl/ whose
# distribution the machine does not have (diffusers always, at the version the engine is tested with) into a
# private folder ($GPU_CHECK_SITE, default /tmp/dit-gpu-site; nothing in the machine's Python changes), says
# which optional modules it found, then runs the tests marked `cuda` (tests/test_gpu_cuda.py) and the kernel
# selection tests (with pytest when there is one, else dit_devtools/cuda_tests.py), `bench gpu` (Flux.1 12B
# layout, engine step against diffusers), the GGUF check (dit_devtools/gguf_device_check.py: Q8_0 / Q4_K blocks
# kept and dequantised on the GPU, equal to the CPU's dequantisation, step time over bf16) and `bench gpu-speed`
# (attention kernels x compiled blocks x bf16 / fp8, within the time left). JSON lands in benchmarks/results/
# (gpu_<gpu>.json, gguf_device_<gpu>.json, gpu_speed_<gpu>.json) and,
# when $OUT is set, in $OUT with the logs. A step that fails or runs out of time is reported and the next runs.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEELS="$ROOT/.whl"
PYTHON=${PYTHON:-python3}
TOTAL_S=${GPU_CHECK_TOTAL_S:-420}  # the whole run's target (8 minutes, less the worst case's margins)
# The wheels the bare device image lacks for the engine, its CUDA tests and the benches (all pure Python;
# sageattention 1.0.6 is Triton code; gguf needs PyYAML, a binary wheel). Versions: those the CPU test suite runs with.
WANTED=(
  diffusers==0.42.1 importlib_metadata==10.2.0 zipp==4.1.2 torchsde==0.2.6 trampoline==0.1.2
  sageattention==1.0.6 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-timeout==2.4.0 packaging==26.4
  gguf==0.19.0 pyyaml==6.0.4
)
ALWAYS=(diffusers)  # installed even when the machine has another version

fetch() {
  mkdir -p "$WHEELS"
  "$PYTHON" -m pip download --dest "$WHEELS" --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any "${WANTED[@]}"
  du -sh "$WHEELS"
}

run() {
  local start=$SECONDS site=${GPU_CHECK_SITE:-/tmp/dit-gpu-site} out=${OUT:-}
  local results="$ROOT/benchmarks/results" logs
  logs=${out:-$ROOT/bench_out}
  mkdir -p "$site" "$results" "$logs"
  [ -d "$WHEELS" ] || { echo "no $WHEELS: run '$0 fetch' on a machine with PyPI and bring .whl/ along" >&2; exit 2; }
  # each wheel whose distribution is missing here (diffusers: always), into the private folder
  mapfile -t todo < <("$PYTHON" - "$WHEELS" "${ALWAYS[@]}" <<'PY'
import importlib.metadata as md, pathlib, re, sys
folder, always = pathlib.Path(sys.argv[1]), {a.lower() for a in sys.argv[2:]}
for wheel in sorted(folder.glob("*.whl")):
    dist = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    try:
        md.version(dist)
        missing = dist in always
    except md.PackageNotFoundError:
        missing = True
    if missing:
        print(wheel)
PY
  )
  if [ "${#todo[@]}" -gt 0 ]; then
    "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$site" "${todo[@]}"
  fi
  export PYTHONPATH="$site:$ROOT" PYTHONDONTWRITEBYTECODE=1
  cd "$ROOT"
  "$PYTHON" - <<'PY' 2>&1 | tee "$logs/gpu_check_env.txt"
import importlib.util, torch
c = torch.cuda.is_available()
print("torch", torch.__version__, "GPU", torch.cuda.get_device_name(0) if c else "none (CPU dry run)",
      "sm%d%d" % torch.cuda.get_device_capability(0) if c else "")
for m in ("diffusers", "transformers", "safetensors", "huggingface_hub", "torchsde", "triton", "sageattention",
          "flash_attn", "flash_attn_interface", "gguf", "yaml", "pytest"):
    print(f"  {m}: {'found' if importlib.util.find_spec(m) else 'MISSING'}")
PY
  local gpu
  gpu=$("$PYTHON" -c "import re, torch; n = torch.cuda.get_device_name(0).lower() if torch.cuda.is_available() \
else 'cpu'; print((re.findall(r'[a-z]+\d+[a-z]*', n) or [n.split()[0]])[-1])")
  echo "== CUDA tests ($((SECONDS - start)) s)"
  local runner=(-m pytest -q -p no:cacheprovider)
  "$PYTHON" -c "import pytest" 2>/dev/null || runner=(-m dit_devtools.cuda_tests)  # a bare image: no pytest
  timeout 200 "$PYTHON" "${runner[@]}" tests/test_gpu_cuda.py tests/test_speed_kernels.py \
    2>&1 | tee "$logs/gpu_check_tests.log" || echo "tests failed or timed out (see gpu_check_tests.log)"
  echo "== bench gpu ($((SECONDS - start)) s)"
  timeout 150 "$PYTHON" -m parallel_runtime bench gpu --json "$results/gpu_$gpu.json" \
    2>&1 | tee "$logs/gpu_check_bench_gpu.log" || echo "bench gpu failed or timed out"
  echo "== GGUF on the device ($((SECONDS - start)) s)"
  timeout 150 "$PYTHON" -m dit_devtools.gguf_device_check --json "$results/gguf_device_$gpu.json" \
    2>&1 | tee "$logs/gpu_check_gguf.log" || echo "GGUF check failed or timed out (see gpu_check_gguf.log)"
  local left=$((TOTAL_S - (SECONDS - start) - 30))
  [ "$left" -lt 60 ] && left=60
  echo "== bench gpu-speed, budget ${left} s ($((SECONDS - start)) s)"
  DIT_GPU_SPEED_BUDGET_S=$left timeout $((left + 60)) "$PYTHON" -m parallel_runtime bench gpu-speed \
    --json "$results/gpu_speed_$gpu.json" 2>&1 | tee "$logs/gpu_check_bench_gpu_speed.log" \
    || echo "bench gpu-speed failed or timed out"
  if [ -n "$out" ]; then
    cp -f "$results/gpu_$gpu.json" "$results/gguf_device_$gpu.json" "$results/gpu_speed_$gpu.json" "$out/" \
      2>/dev/null || true
  fi
  echo "== done in $((SECONDS - start)) s"
}

case "${1:-run}" in
  fetch) fetch ;;
  run) run ;;
  *) echo "usage: $0 fetch | run" >&2; exit 2 ;;
esac
