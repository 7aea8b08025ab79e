#!/usr/bin/env bash
# The GPU checks of one lent H100 or H200, in one call under 9 minutes; everything they write goes to $OUT.
#
#   bash benchmarks/gpu/run_all.sh --fetch-wheels   # here, before the call: what the GPU machine's image lacks, in .whl/
#   bash benchmarks/gpu/run_all.sh                  # there: run(command="bash benchmarks/gpu/run_all.sh",
#                                                   #            carry=[".whl"], timeout_s=540)
#
# In this order, each step bounded so that the whole ends within $DEADLINE seconds (470), what matters most first:
#   env.txt                  the GPU, its driver, Python and the packages the trainer runs on
#   gpu-tests.log            python -m pytest -m gpu -q -k "$GPU_TESTS" on the files that hold gpu-marked tests, for
#                            at most $TEST_BUDGET s (default: the varlen_attn test, 75 s: the levers below measure it,
#                            so its losses come first; GPU_TESTS= runs every gpu test, TEST_BUDGET=0 none)
#   moe-kernels.*            python benchmarks/moe_kernels.py --variants $KERNEL_VARIANTS: the raw decoder layers'
#                            ceiling per moe_experts_implementation and attention, and the top CUDA kernels of one
#                            step ($KERNEL_BUDGET)
#   moe-layer-bench.*        python benchmarks/moe_layer_bench.py --levers $MOE_LEVERS --layers 2,4: the trainer at
#                            two layer counts per lever, each lever's whole model (48 layers) projected
# Exit status: the first failing step's, else 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${WHEELS:-.whl}
# What the trainer, the data step and the gpu tests import that the machine's image ('cuda': torch 2.11,
# transformers 5.17, accelerate 1.15, no datasets, no DeepSpeed, no pydantic) lacks, at pyproject.toml's pins where it
# has one: datasets needs dill and multiprocess, DeepSpeed hjson and pydantic (pydantic-core matches pydantic).
PACKAGES="transformers==5.23.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 hjson==3.1.0 pydantic==2.14.4
  pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 liger-kernel==0.8.5 peft==0.21.2"
DEEPSPEED=deepspeed==0.19.8  # published as source only: built here into a pure-Python wheel (ops compile at run time)

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p "$WHEELS"
  case $WHEELS in  # a folder in the checkout travels only when git ignores it and carry names it
    /*) ;;
    *) grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >>.git/info/exclude ;;
  esac
  # shellcheck disable=SC2086  # one word per package
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" $PACKAGES || exit
  DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w "$WHEELS" "$DEEPSPEED" || exit
  du -sh "$WHEELS"
  exit
fi

OUT=${OUT:?set OUT to the folder for the results}
DEADLINE=${DEADLINE:-470}
TEST_BUDGET=${TEST_BUDGET:-75}
GPU_TESTS=${GPU_TESTS-varlen}  # a pytest -k expression: only those gpu tests (set and empty: all of them)
KERNEL_BUDGET=${KERNEL_BUDGET:-120}
# The 2026-11-29 calls (an H200) measured varlen_attn against SDPA (benchmarks/results/moe-layer-bench.md), and auto
# now chooses it: next, the preset (varlen under auto) against the sdpa lever on an H100, the reference job's card, to
# re-base achieved_tflops_per_gpu (the H100's SDPA figure), then the EP-8 share.
KERNEL_VARIANTS=${KERNEL_VARIANTS:-grouped_mm_compiled,compiled-varlen}
MOE_LEVERS=${MOE_LEVERS:-preset,sdpa,ep8-share-compiled-varlen}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() { echo $((DEADLINE - SECONDS)); }
status=0
step() {  # step NAME LOG SECONDS COMMAND...: run COMMAND for at most SECONDS, its output in LOG
  local name=$1 log=$2 limit=$3 rc
  shift 3
  if [ "$limit" -lt 30 ]; then
    echo "== $name: not run, $limit s left of $DEADLINE" | tee "$log"
    return
  fi
  echo "== $name ($limit s at most): $*"
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $SECONDS s in all"
  tail -n 25 "$log"
  [ "$status" -ne 0 ] || status=$rc
}

if [ -d "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || exit
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 --version
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|triton|transformers|deepspeed|accelerate|datasets|peft|liger.kernel|flash.attn|pyarrow|huggingface.hub|tokenizers|safetensors|numpy) '
  python3 -c 'import transformers, deepspeed, datasets; print("imports", transformers.__version__, deepspeed.__version__, datasets.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# Only the files that hold gpu tests: collecting the whole tree would import kfp and the Kubernetes client, which the
# image lacks; the root conftest (a fake cluster) needs the Kubernetes client too, and no gpu test uses it.
mapfile -t gpu_files < <(grep -rlE "pytest\.mark\.gpu" tests --include='test_*.py' | sort)
noconftest=$(python3 -c 'import kubernetes' 2>/dev/null || echo --noconftest)
step gpu-tests "$OUT/gpu-tests.log" "$TEST_BUDGET" \
  python3 -m pytest -m gpu -q -rs -p no:cacheprovider $noconftest ${GPU_TESTS:+-k "$GPU_TESTS"} "${gpu_files[@]}"
step moe-kernels "$OUT/moe-kernels.log" "$KERNEL_BUDGET" \
  python3 benchmarks/moe_kernels.py --variants "$KERNEL_VARIANTS" --variant-timeout 90 --out "$OUT"
# The rest of the deadline, less a margin for the benchmark's own ending; it stops starting runs when time runs short.
MOE_BUDGET=$(($(left) - 20))
step moe-layer-bench "$OUT/moe-layer-bench.log" "$((MOE_BUDGET + 15))" \
  python3 benchmarks/moe_layer_bench.py --levers "$MOE_LEVERS" --layers 2,4 --budget-seconds "$MOE_BUDGET" --out "$OUT"
exit "$status"
