#!/usr/bin/env bash
# gpu-session.sh: the GPU checks of a meshtrain build in one call on a GPU machine that has
# none of our Debian libraries (the device machines lent to development sessions: one H100 or
# H200, CUDA 13, PyTorch and transformers, no network). Runs, in priority order, each step
# under its own time limit so that the whole fits one call:
#   1. env          nvidia-smi, nvcc, the Python packages used below
#   2. unit         the gpu-labelled test programs (kernels, matmul, attention, MoE, a whole
#                   training step against the CPU backend) and the communicator tests (NCCL
#                   mesh smoke, test_cuda_comm on 2 ranks sharing the GPU)
#   3. sanitizer    compute-sanitizer memcheck and racecheck over the kernel tests
#   4. curves       the 200-step loss curves of the debug decks against the CPU (single rank;
#                   FSDP 2, TP 2 and MoE at ep 2 on 2 ranks), tests/gpu/loss_curve.py
#   5. export       `meshtrain ckpt export` loaded by transformers (validation/
#                   check_export_transformers.py), loss against meshtrain's to 1e-5 in fp32
#   6. bench        perf/gpu_step_bench.py (Llama 3.2 1B shape; PyTorch eager and compile; no
#                   nsys, which cannot make a report on those machines)
# Every step's output goes to a log; the logs come back as one tarball beside summary.txt (the
# device tool returns at most 8 files). BUDGET_S (default 540) bounds the whole run: a step
# whose time limit no longer fits is reported NOT RUN, so a call never outlasts its limit.
# All steps need more than one call's 10 minutes: run them as, e.g., three calls
#   ... env unit sanitizer  /  ... curves export  /  ... bench
#
# Build and pack here (no GPU needed), then carry the tarball:
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_SHARED_LIBS=ON \
#         -DMESHTRAIN_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DMESHTRAIN_CUDA=ON
#   cmake --build build-gpu -j 2 --target meshtrain gpu-tests
#   BUNDLE_TESTS=1 BUNDLE_CUDA_LIBS=0 scripts/make-bundle.sh build-gpu
# On the GPU machine, from the repository root:
#   OUT=/some/dir [DATA=tiny.h5] scripts/gpu-session.sh build-gpu/meshtrain-bundle-*.tar.gz [STEP...]
# STEP names limit the run to those steps (default: all, in the order above). DATA: the
# equivalence tests' token corpus (build/tests/equivalence/tiny.h5), else made here (perl).
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 on a usage error.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tarball=${1:-}
[ -n "$tarball" ] && [ -f "$tarball" ] || { echo "usage: OUT=DIR $0 BUNDLE.tar.gz [STEP...]" >&2; exit 2; }
shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(env unit sanitizer curves export bench)
out=${OUT:-/tmp/gpu-session-out}
work=/tmp/gpu-session
logs=$work/logs
rm -rf "$work"
mkdir -p "$out" "$logs"
summary=$out/summary.txt
: > "$summary"
failed=0

budget=${BUDGET_S:-540}
note() { echo "$*" | tee -a "$summary"; }
# step NAME LIMIT_S CMD...: runs CMD with a time limit (cut to what is left of BUDGET_S), its
# output in logs/NAME.log.
run_step() {
  local name=$1 limit=$2 t0=$SECONDS rc left
  shift 2
  left=$((budget - SECONDS - 15))
  [ "$limit" -le "$left" ] || limit=$left
  if [ "$limit" -lt 20 ]; then
    failed=1
    note "NOT RUN  $name  (the ${budget} s budget is spent)"
    return
  fi
  timeout --kill-after=10 "$limit" "$@" > "$logs/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    note "PASS  $name  ($((SECONDS - t0)) s)"
  elif [ $rc -eq 77 ]; then
    note "SKIP  $name  ($((SECONDS - t0)) s)"
  else
    failed=1
    note "FAIL  $name  rc=$rc$([ $rc -eq 124 ] && echo ' (time limit)')  ($((SECONDS - t0)) s): tail of logs/$name.log:"
    tail -n 15 "$logs/$name.log" | sed 's/^/      /' >> "$summary"
  fi
}
wanted() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# The bundle: unpacked, checked, its environment (bin/ first on PATH, lib/ on LD_LIBRARY_PATH,
# Open MPI pointed at its plugins) in this shell; the CUDA libraries it leaves to the node come
# from the toolkit or from PyTorch's pip packages (nvidia/*/lib).
mkdir -p "$work/bundle"
tar -C "$work/bundle" -xzf "$tarball" || { note "FAIL  unpack $tarball"; exit 1; }
B=$(echo "$work"/bundle/meshtrain-bundle-*)
(cd "$B" && sha256sum --quiet -c MANIFEST) > "$logs/manifest.log" 2>&1 || { note "FAIL  bundle MANIFEST"; exit 1; }
pip_libs=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
dirs = []
for sp in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
print(":".join(dirs))
EOF
)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}${pip_libs}:/usr/local/cuda/lib64"
eval "$("$B/meshtrain-run" env)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
"$B/meshtrain-run" check > "$logs/libraries.log" 2>&1 || note "WARN  meshtrain-run check: a library is unresolved (logs/libraries.log)"
note "bundle $(sed -n 's/^name=//p' "$B/BUILDINFO"), commit $(sed -n 's/^commit=//p' "$B/BUILDINFO" | cut -c1-12)"

# The token corpus of the equivalence tests: DATA (carried), else made as ctest's tiny_corpus
# fixture makes it (needs perl).
data=${DATA:-$work/tiny.h5}
if [ ! -f "$data" ]; then
  { "$root/tests/fixtures/make_corpus.sh" "$work/corpus" 60 &&
      meshtrain data prepare --input "$work/corpus" --output "$data" --vocab-size 512; } > "$logs/corpus.log" 2>&1 ||
    note "WARN  no token corpus (logs/corpus.log): the curves and export steps will fail"
fi

if wanted env; then
  run_step env 60 bash -c 'nvidia-smi; nvcc --version; python3 -c "import torch, transformers, h5py; print(\"torch\", torch.__version__, torch.cuda.get_device_name(0)); print(\"transformers\", transformers.__version__)"; compute-sanitizer --version'
fi

if wanted unit; then
  for t in test_cuda_kernels test_cuda_matmul test_cuda_attention test_cuda_moe test_cuda_train_step; do
    run_step "$t" 180 "$B/bin/$t" --log_level=test_suite --report_level=short
  done
  run_step nccl_mesh_smoke 120 mpirun -np 1 "$B/bin/nccl_mesh_smoke"
  run_step test_cuda_comm 240 mpirun -np 2 "$B/bin/test_cuda_comm" --report_level=short
fi

if wanted sanitizer; then
  for tool in memcheck racecheck; do
    run_step "sanitizer_$tool" 180 compute-sanitizer --tool "$tool" --error-exitcode 1 \
      "$B/bin/test_cuda_kernels" --report_level=short
  done
fi

if wanted curves; then
  printf '#!/usr/bin/env bash\nexec mpirun "$@"\n' > "$work/mpirun"
  chmod +x "$work/mpirun"
  for deck in llama3_debug qwen3_debug; do
    run_step "curve_$deck" 300 python3 "$root/tests/gpu/loss_curve.py" --meshtrain "$B/bin/meshtrain" \
      --deck "$root/inputs/$deck.toml" --data "$data" --out "$work/curve_$deck" --steps 200 --precision bfloat16
  done
  run_step curve_llama3_debug_fsdp2 300 python3 "$root/tests/gpu/loss_curve.py" --meshtrain "$B/bin/meshtrain" \
    --deck "$root/inputs/llama3_debug.toml" --data "$data" --out "$work/curve_fsdp2" --steps 200 \
    --precision bfloat16 --np 2 --mpirun "$work/mpirun" -- --parallelism.data_parallel_shard_degree=2 \
    --training.mixed_precision_reduce=bfloat16
  run_step curve_llama3_debug_tp2 300 python3 "$root/tests/gpu/loss_curve.py" --meshtrain "$B/bin/meshtrain" \
    --deck "$root/inputs/llama3_debug.toml" --data "$data" --out "$work/curve_tp2" --steps 200 \
    --precision bfloat16 --np 2 --mpirun "$work/mpirun" -- --parallelism.tensor_parallel_degree=2 \
    --parallelism.data_parallel_shard_degree=1
  run_step curve_llama3_debug_moe_ep2 300 python3 "$root/tests/gpu/loss_curve.py" --meshtrain "$B/bin/meshtrain" \
    --deck "$root/inputs/llama3_debug.toml" --data "$data" --out "$work/curve_moe_ep2" --steps 200 \
    --precision bfloat16 --np 2 --mpirun "$work/mpirun" -- --parallelism.data_parallel_shard_degree=2 \
    --parallelism.expert_parallel_degree=2 --model.num_experts=8 --model.top_k=2 --model.moe_inter_dim=128 \
    --model.n_dense_layers=1
fi

if wanted export; then
  run_step export 240 python3 "$root/validation/check_export_transformers.py" --meshtrain "$B/bin/meshtrain" \
    --dump-grads "$B/bin/dump_grads" --data "$data" --out "$work/export" --tol 1e-5
fi

if wanted bench; then
  run_step bench 500 python3 "$root/perf/gpu_step_bench.py" --build "$B" --no-nsys --out "$work/gpu_bench.json"
  [ -f "$work/gpu_bench.json" ] && cp "$work/gpu_bench.json" "$out/gpu_bench.json"
fi

tar -C "$work" -czf "$out/logs.tar.gz" logs
note "logs: logs.tar.gz ($(ls "$logs" | wc -l) files)"
exit $failed
