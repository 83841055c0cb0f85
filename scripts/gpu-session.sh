#!/usr/bin/env bash
# gpu-session.sh: the GPU checks of a meshtrain build on a GPU machine that has none of our
# Debian libraries (the device machines lent to development sessions: one H100 or H200, CUDA 13,
# PyTorch and transformers, no network), sized so that one window (15 minutes of device time,
# 1-2 of them to start the machine, at most 10 minutes per command) runs them all as two
# commands issued back to back:
#   first   (BUDGET_S 300, under the 5-minute mark; the CPU curves made beforehand, cpu-refs)
#     env        nvidia-smi, nvcc, the Python packages used below, compute-sanitizer
#     unit       the gpu-labelled test programs: kernels, matmul, attention, document-masked
#                attention, MoE, Muon, Float8 (casts and FP8 GEMMs), then test_cuda_train_step (a whole
#                training step against the CPU backend)
#     nccl       the single-rank NCCL mesh smoke, then test_cuda_comm (2 ranks sharing the GPU)
#     curves     100-step bf16 loss curves against the CPU, tests/gpu/loss_curve.py:
#                llama3_debug, qwen3_debug, llama3_debug at FSDP 2 (2 ranks sharing the GPU),
#                MoE (llama3_debug with 8 experts, ep 2 on 2 ranks),
#                Float8 tensorwise at FSDP 2 with the FP8 all-gather (FP8 GEMMs on the GPU)
#     memcheck   compute-sanitizer memcheck over every kernel test program, whole (the
#                training-step program split by test case), 6 at a time in the background from
#                the end of `unit` while nccl and curves run; collected before `sanitizer`, each
#                job cut at the budget's end. PASS = memcheck's "ERROR SUMMARY: 0 errors"
#                (whatever the program's own assertions said: `unit` reports those)
#     sanitizer  compute-sanitizer memcheck, only over the kernel test programs that failed
#                above and only their failed test cases (nothing to do when all passed, or when
#                memcheck covered them)
#   memcheck  (BUDGET_S 290; the memcheck step alone, in the foreground, for a window's spare minutes)
#   second  (BUDGET_S 290, under the 5-minute mark)
#     export     `meshtrain ckpt export` loaded by transformers (validation/
#                check_export_transformers.py), loss against meshtrain's to 1e-5 in fp32
#     bench      perf/gpu_step_bench.py at local batch 4 (no batch search, no nsys; 210 s)
#     kernels    GPU time by kernel of one training step of the bench's deck, from ncu
#                (perf/ncu_kernel_table.py; 150 s; kernels.json)
# Each step runs under its own time limit, cut to what is left of BUDGET_S; a step that no longer
# fits is reported NOT RUN, so a command never outlasts its slot. Every step writes a log; the
# logs come back as one tarball, logs.tar.gz, beside summary.txt (and gpu_bench.json).
#
# Build and pack here (no GPU needed; sm_90 only), then carry the tarball:
#   make gpu-session-bundle      # the same as:
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_SHARED_LIBS=ON \
#         -DMESHTRAIN_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DMESHTRAIN_CUDA=ON
#   cmake --build build-gpu -j 2 --target gpu-tests
#   BUNDLE_TESTS=1 BUNDLE_CUDA_LIBS=0 scripts/make-bundle.sh build-gpu
# On the GPU machine, from the repository root:
#   OUT=/some/dir DATA=tiny.h5 scripts/gpu-session.sh build-gpu/meshtrain-bundle-*.tar.gz first
#   OUT=/some/dir DATA=tiny.h5 scripts/gpu-session.sh build-gpu/meshtrain-bundle-*.tar.gz second
# Before the window, on any machine (no GPU needed), the CPU reference curves:
#   OUT=build/gpu-ref DATA=tiny.h5 scripts/gpu-session.sh BUNDLE cpu-refs
# and carry that folder: with CPU_REF=build/gpu-ref the curves step runs only the GPU side
# (the CPU runs are the slowest part of the step on the GPU machine's 16 cores). Curves without
# one (no time to make them: a GPU lent late in a session) have their CPU runs started in the
# background as `first` begins, on 10 of the machine's cores while the unit and NCCL steps run;
# the curves step then waits for each (window 2's MoE curve ran out of its 120 s doing both).
# Step names after the command limit it to those steps (a rerun after a fix). DATA: the
# equivalence tests' token corpus (build/tests/equivalence/tiny.h5), else made here (perl).
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 on a usage error.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tarball=${1:-}
command=${2:-}
usage() { echo "usage: OUT=DIR [DATA=tiny.h5] [CPU_REF=DIR] $0 BUNDLE.tar.gz first|second|memcheck|cpu-refs [STEP...]" >&2; exit 2; }
[ -n "$tarball" ] && [ -f "$tarball" ] || usage
case "$command" in
  first) all_steps=(env unit memcheck nccl curves sanitizer); default_budget=300 ;;
  second) all_steps=(export bench kernels); default_budget=290 ;;
  memcheck) all_steps=(memcheck); default_budget=290 ;;
  cpu-refs) all_steps=(refs); default_budget=3000 ;;
  *) usage ;;
esac
shift 2
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${all_steps[@]}")
out=${OUT:-/tmp/gpu-session-out}
work=/tmp/gpu-session
logs=$work/logs
rm -rf "$work"
mkdir -p "$out" "$logs"
summary=$out/summary.txt
: > "$summary"
failed=0

budget=${BUDGET_S:-$default_budget}
note() { echo "$*" | tee -a "$summary"; }
note "gpu-session $command: steps ${steps[*]}, budget ${budget} s"
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

# Every loss curve of the kit: FN NAME DECK NP [OVERRIDES...] for each.
curves_each() {
  "$1" llama3_debug llama3_debug 1
  "$1" qwen3_debug qwen3_debug 1
  # FSDP 2 on the two ranks sharing the GPU (host-staged MPI): bf16 parameter all-gathers and,
  # on the GPU, bf16 gradient reduce-scatters; the issue's FSDP curve, dense, apart from MoE's.
  "$1" llama3_debug_fsdp2 llama3_debug 2 --parallelism.data_parallel_shard_degree=2 \
    cuda:--training.mixed_precision_reduce=bfloat16
  "$1" llama3_debug_moe_ep2 llama3_debug 2 --parallelism.data_parallel_shard_degree=2 \
    --parallelism.expert_parallel_degree=2 --model.num_experts=8 --model.top_k=2 --model.moe_inter_dim=128 \
    --model.n_dense_layers=1
  # Float8 (tensorwise, the default recipe) at FSDP 2 with the FP8 all-gather: cuBLASLt's FP8
  # GEMMs and the e4m3 gather on the GPU against the CPU's emulation, under TorchTitan's
  # debug-preset schedule (lr 8e-4, 2 warm-up steps, linear decay; at the deck's lr 3e-3 float32
  # itself spikes at step 31).
  "$1" llama3_debug_float8_fsdp2 llama3_debug 2 --parallelism.data_parallel_shard_degree=2 \
    --model.converters=float8 \
    --quantize.linear.float8.filter_fqns=output cpu:--quantize.linear.float8.emulate=true \
    cuda:--quantize.linear.float8.emulate=false --quantize.linear.float8.enable_fsdp_float8_all_gather=true \
    --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp=true \
    --optimizer.lr=8e-4 --lr_scheduler.warmup_steps=2 --lr_scheduler.decay_type=linear --lr_scheduler.min_lr_factor=0.0
}
printf '#!/usr/bin/env bash\nexec mpirun "$@"\n' > "$work/mpirun"
chmod +x "$work/mpirun"
curve_args() {  # the loss_curve.py arguments of curve NAME DECK NP
  echo --meshtrain "$B/bin/meshtrain" --deck "$root/inputs/$2.toml" --data "$data" --out "$work/curve_$1" \
    --steps 100 --precision bfloat16 --np "$3" --mpirun "$work/mpirun"
}

# The CPU reference curves this window did not bring (CPU_REF): started now in the background on
# the machine's CPU cores, beside the GPU steps that come before the curves (the unit tests use a
# core or two), each saved as $work/refs/NAME.jsonl; the curves step waits for its own.
declare -A bg_ref=() bg_t0=()
if wanted curves; then
  mkdir -p "$work/refs"
  bg_ref_curve() {  # bg_ref_curve NAME DECK NP [OVERRIDES...]
    [ -n "${CPU_REF:-}" ] && [ -f "$CPU_REF/$1.jsonl" ] && return
    # 3 threads a curve of one rank, 1 a rank at np 2: 12 of the 16 cores for the five, 4 left to
    # the GPU steps' processes
    # shellcheck disable=SC2046
    OMP_NUM_THREADS=$(($3 == 1 ? 3 : 1)) timeout --kill-after=10 $((budget - SECONDS - 30)) \
      python3 "$root/tests/gpu/loss_curve.py" $(curve_args "$1" "$2" "$3") \
      --write-cpu-metrics "$work/refs/$1.jsonl" -- "${@:4}" > "$logs/ref_$1.log" 2>&1 &
    bg_ref[$1]=$!
    bg_t0[$1]=$SECONDS
  }
  curves_each bg_ref_curve
  [ ${#bg_ref[@]} -eq 0 ] || note "CPU reference curves started in the background: ${!bg_ref[*]}"
fi


kernel_tests=(test_cuda_kernels test_cuda_matmul test_cuda_attention test_cuda_doc_attention test_cuda_moe test_cuda_muon
  test_cuda_float8 test_cuda_train_step)

if wanted env; then
  run_step env 30 bash -c 'nvidia-smi; nvcc --version; python3 -c "import torch, transformers, h5py; print(\"torch\", torch.__version__, torch.cuda.get_device_name(0)); print(\"transformers\", transformers.__version__)"; compute-sanitizer --version'
fi

if wanted unit; then
  for t in "${kernel_tests[@]}"; do
    run_step "$t" 90 "$B/bin/$t" --log_level=test_suite --report_level=short
  done
fi

# compute-sanitizer memcheck over every kernel test program in the background, 6 jobs at a time
# (2 while CPU reference curves run in the background; the machine's 16 cores also run the nccl
# and curves steps meanwhile), the slowest first:
# test_cuda_train_step one job per test case (Boost's --list_content; the whole program when it
# lists nothing), then the others whole. Each job ends by the budget's end less 25 s and leaves
# logs/memcheck_NAME.log and $work/memcheck/NAME.rc ("RC SECONDS", or "notrun 0").
memcheck_pid=
sanitizer_bin=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
memcheck_start() {
  local jobs=$work/memcheck/jobs t c
  if [ -z "$sanitizer_bin" ]; then
    failed=1
    note "NOT RUN  memcheck  (no compute-sanitizer on PATH or in /usr/local/cuda)"
    return
  fi
  mkdir -p "$work/memcheck"
  : > "$jobs"
  for c in $("$B/bin/test_cuda_train_step" --list_content 2>&1 | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)\*$/\1/p'); do
    echo "test_cuda_train_step.$c test_cuda_train_step $c" >> "$jobs"
  done
  grep -q "^test_cuda_train_step\." "$jobs" || echo "test_cuda_train_step test_cuda_train_step" >> "$jobs"
  for t in "${kernel_tests[@]}"; do
    [ "$t" = test_cuda_train_step ] || echo "$t $t" >> "$jobs"
  done
  cat > "$work/memcheck/job.sh" <<'JOB'
#!/usr/bin/env bash
# job.sh SANITIZER DEADLINE BIN LOGS RCDIR NAME PROGRAM [CASE]: one memcheck job, ended by
# DEADLINE (epoch s).
sanitizer=$1
shift
deadline=$1 bin=$2 logs=$3 rcdir=$4 name=$5 prog=$6 case=${7:-}
t0=$(date +%s)
limit=$((deadline - t0))
if [ "$limit" -lt 10 ]; then echo "notrun 0" > "$rcdir/$name.rc"; exit 0; fi
timeout --kill-after=10 "$limit" "$sanitizer" --tool memcheck --error-exitcode 1 "$bin/$prog" \
  --report_level=short ${case:+--run_test=$case} > "$logs/memcheck_$name.log" 2>&1
echo "$? $(($(date +%s) - t0))" > "$rcdir/$name.rc"
JOB
  local deadline=$(($(date +%s) + budget - SECONDS - 25)) parallel=6 pid
  # CPU reference curves still running in the background hold 12 of the 16 cores: 2 jobs then.
  for pid in "${bg_ref[@]}"; do kill -0 "$pid" 2>/dev/null && parallel=2; done
  awk -v d="$deadline" -v b="$B/bin" -v l="$logs" -v r="$work/memcheck" '{ print d, b, l, r, $0 }' "$jobs" |
    xargs -P "$parallel" -L 1 bash "$work/memcheck/job.sh" "$sanitizer_bin" &
  memcheck_pid=$!
  note "memcheck: $(wc -l < "$jobs") jobs started in the background, $parallel at a time"
}
# Waits for the background jobs (each already bounded by the budget) and reports one line each.
memcheck_collect() {
  [ -n "$memcheck_pid" ] || return
  wait "$memcheck_pid"
  local name prog rc secs errors
  while read -r name prog _; do
    read -r rc secs < "$work/memcheck/$name.rc" 2>/dev/null || { rc=missing; secs=0; }
    errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p' "$logs/memcheck_$name.log" 2>/dev/null | tail -n 1)
    if [ "$rc" = notrun ]; then
      failed=1
      note "NOT RUN  memcheck_$name  (the ${budget} s budget is spent)"
    elif [ "$rc" = 77 ]; then
      note "SKIP  memcheck_$name  ($secs s)"
    elif [ "$errors" = 0 ]; then
      note "PASS  memcheck_$name  (0 errors, program rc=$rc, $secs s)"
    else
      failed=1
      note "FAIL  memcheck_$name  rc=$rc$([ "$rc" = 124 ] && echo ' (time limit)') errors=${errors:-?}  ($secs s): tail of logs/memcheck_$name.log:"
      tail -n 15 "$logs/memcheck_$name.log" 2>/dev/null | sed 's/^/      /' >> "$summary"
    fi
  done < "$work/memcheck/jobs"
  memcheck_pid=
}
if wanted memcheck; then
  memcheck_start
  [ "$command" = memcheck ] && memcheck_collect
fi

if wanted nccl; then
  run_step nccl_mesh_smoke 45 mpirun -np 1 "$B/bin/nccl_mesh_smoke"
  run_step test_cuda_comm 90 mpirun -np 2 "$B/bin/test_cuda_comm" --log_level=test_suite --report_level=short
fi

if wanted curves; then
  curve() {  # curve NAME DECK NP [OVERRIDES...]: 100 bf16 steps on the GPU against the CPU
    local name=$1 ref=() rc
    # The CPU curve made before the window (command cpu-refs), when there is one for this curve;
    # else the one started in the background above, once it has ended; else (it failed) the CPU
    # side runs here, inside the step's limit.
    if [ -n "${CPU_REF:-}" ] && [ -f "$CPU_REF/$name.jsonl" ]; then
      ref=(--cpu-metrics "$CPU_REF/$name.jsonl")
    elif [ -n "${bg_ref[$name]:-}" ]; then
      wait "${bg_ref[$name]}"
      rc=$?
      if [ $rc -eq 0 ] && [ -f "$work/refs/$name.jsonl" ]; then
        note "      CPU reference $name: made in the background ($((SECONDS - bg_t0[$name])) s after its start)"
        ref=(--cpu-metrics "$work/refs/$name.jsonl")
      else
        note "WARN  CPU reference $name in the background failed (rc=$rc, logs/ref_$name.log): its CPU side runs in the step"
      fi
    fi
    # shellcheck disable=SC2046
    run_step "curve_$name" 120 python3 "$root/tests/gpu/loss_curve.py" $(curve_args "$1" "$2" "$3") "${ref[@]}" \
      -- "${@:4}"
  }
  curves_each curve
fi

if wanted refs; then
  ref_curve() {  # ref_curve NAME DECK NP [OVERRIDES...]: the CPU curve only, saved as OUT/NAME.jsonl
    # The machine's cores shared by the curve's ranks (every rank taking them all oversubscribes
    # them: the Float8 curve at np 2 took 318 s so on a 2-core VM, 162 s at 1 thread a rank).
    local threads=$(($(nproc) / $3))
    # shellcheck disable=SC2046
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((threads > 0 ? threads : 1))} run_step "ref_$1" 900 \
      python3 "$root/tests/gpu/loss_curve.py" $(curve_args "$1" "$2" "$3") \
      --write-cpu-metrics "$out/$1.jsonl" -- "${@:4}"
  }
  curves_each ref_curve
fi

memcheck_collect
if wanted sanitizer; then
  # Only where a kernel test failed: its failed cases (Boost's 'error: in "CASE"' lines), or the
  # whole program when it died without naming one; not where memcheck covered the program.
  ran=0
  for t in "${kernel_tests[@]}"; do
    grep -q "^FAIL  $t " "$summary" || continue
    # memcheck ran all of it (clean or not): nothing to add
    if grep -qE "^(PASS|FAIL)  memcheck_$t[ .]" "$summary" &&
      ! grep -qE "^NOT RUN  memcheck_$t[ .]|^FAIL  memcheck_$t[ .].*\(time limit\)" "$summary"; then
      continue
    fi
    cases=$(grep -o 'error: in "[^"]*"' "$logs/$t.log" 2>/dev/null | sed 's/^error: in "\(.*\)"$/\1/' | sort -u |
      paste -sd, -)
    run_step "sanitizer_$t" 120 "${sanitizer_bin:-compute-sanitizer}" --tool memcheck --error-exitcode 1 "$B/bin/$t" \
      --report_level=short ${cases:+--run_test=$cases}
    ran=1
  done
  [ $ran -eq 1 ] || note "SKIP  sanitizer  (no kernel test failed)"
fi


if wanted export; then
  run_step export 70 python3 "$root/validation/check_export_transformers.py" --meshtrain "$B/bin/meshtrain" \
    --dump-grads "$B/bin/dump_grads" --data "$data" --out "$work/export" --tol 1e-5
fi

if wanted bench; then
  # torch.compile's first compilation of the 16-layer model takes most of a minute.
  run_step bench 210 python3 "$root/perf/gpu_step_bench.py" --build "$B" --no-nsys --batch 4 --steps 12 --warmup 4 \
    --trial-timeout 100 --out "$work/gpu_bench.json"
  [ -f "$work/gpu_bench.json" ] && cp "$work/gpu_bench.json" "$out/gpu_bench.json"
fi

if wanted kernels; then
  # GPU time by kernel of one training step of the benchmark's deck (written by the bench step),
  # from ncu (the machines have no usable nsys): 3 steps at local batch 4, only the kernels of
  # step 3 profiled (its NVTX range; window 1's ncu over whole runs spent 103 s on step 1 alone).
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  bench_deck="$root/perf/out/gpu_bench/deck.toml"
  if [ -z "$ncu_bin" ] || [ ! -f "$bench_deck" ]; then
    note "SKIP  kernels  (needs ncu and the bench step's deck, $bench_deck)"
  else
    run_step kernels 150 bash -c '"$1" --csv --print-units base --clock-control none --cache-control none \
      --print-kernel-base demangled --target-processes all --nvtx --nvtx-include "step 3/" \
      --metrics gpu__time_duration.sum --log-file "$2/ncu.csv" \
      meshtrain train --deck "$3" --training.local_batch_size=4 --training.global_batch_size=4 --training.steps=3 \
      --job.dump_folder="$2/ncu_dump" --job.final_dump=false &&
      python3 "$4/perf/ncu_kernel_table.py" --csv "$2/ncu.csv" --json "$5/kernels.json"' \
      _ "$ncu_bin" "$work" "$bench_deck" "$root" "$out"
    cat "$logs/kernels.log" | tail -n 30 >> "$summary"
  fi
fi

tar -C "$work" -czf "$out/logs.tar.gz" logs
note "logs: logs.tar.gz ($(ls "$logs" | wc -l) files)"
exit $failed
