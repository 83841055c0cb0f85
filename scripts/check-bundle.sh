#!/usr/bin/env bash
# Checks a meshtrain bundle (scripts/make-bundle.sh) the way a bare node would use it: unpacks the
# tarball into a fresh folder, verifies MANIFEST, runs `meshtrain-run check`, then runs meshtrain
# with an empty environment (env -i): `model info`, `deck check` at 2 ranks through the bundled
# mpirun, a tiny 2-rank training run on the CPU device, and a 1-rank run without mpirun (MPI
# singleton, which starts the bundled orted). As root with unshare(1), those commands run again
# in a private mount namespace where /usr/lib/x86_64-linux-gnu holds nothing but the glibc
# family and bash's libraries, and /etc/openmpi and /usr/share/openmpi are empty: a node without
# Open MPI or any of meshtrain's packages. LD_DEBUG=libs then lists every library a rank loads;
# each one outside the glibc family must come from the bundle.
# Needs a CPU-capable build (the training runs use device = "cpu").
#
# usage: scripts/check-bundle.sh TARBALL [WORKDIR]      (WORKDIR default: a new folder in /tmp)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tarball=${1:?usage: check-bundle.sh TARBALL [WORKDIR]}
work=${2:-$(mktemp -d /tmp/bundle-check.XXXXXX)}
t0=$SECONDS
fail() { echo "check-bundle.sh: FAILED: $*" >&2; exit 1; }
step() { echo "== $*"; }

rm -rf "$work/unpacked" "$work/data" "$work/runs"
mkdir -p "$work/unpacked" "$work/data" "$work/runs"
tar -xzf "$tarball" -C "$work/unpacked"
B=$(echo "$work"/unpacked/meshtrain-bundle-*)
[ -x "$B/meshtrain-run" ] || fail "no meshtrain-bundle-*/meshtrain-run in $tarball"

step "MANIFEST"
(cd "$B" && sha256sum -c --quiet MANIFEST) || fail "MANIFEST does not match the files"

step "meshtrain-run check"
env -i PATH=/usr/bin:/bin HOME=/tmp "$B/meshtrain-run" check | tail -2

# A tiny corpus and token store, made with the bundle itself (tiny.toml: vocabulary 512).
"$root/tests/fixtures/make_corpus.sh" "$work/data/corpus" 60
env -i PATH=/usr/bin:/bin HOME=/tmp "$B/meshtrain-run" meshtrain data prepare --input "$work/data/corpus" \
  --output "$work/data/tiny.h5" --vocab-size 512 > "$work/data/prepare.log" 2>&1 ||
  { cat "$work/data/prepare.log"; fail "data prepare"; }
cp "$root/tests/equivalence/tiny.toml" "$work/data/tiny.toml"

# The commands, run by `bash -c` inside whatever environment the caller set up. $1: label.
run_suite() {
  local label=$1 out="$work/runs/$1"
  mkdir -p "$out"
  local mpi=(--allow-run-as-root --oversubscribe --bind-to none)
  local train=(train --deck "$work/data/tiny.toml" "--training.dataset=$work/data/tiny.h5" --training.steps=3
               --validation.enable=false)
  step "[$label] meshtrain-run meshtrain model info --name llama3 --flavor 1B"
  "$B/meshtrain-run" meshtrain model info --name llama3 --flavor 1B | head -2
  step "[$label] meshtrain-run -np 2 ... -- deck check (2 ranks, bundled mpirun)"
  "$B/meshtrain-run" -np 2 "${mpi[@]}" -- deck check --deck "$work/data/tiny.toml" --world-size 2 \
    "--training.dataset=$work/data/tiny.h5" | tail -1
  step "[$label] meshtrain-run -np 2 ... meshtrain train (2 ranks, FSDP, 3 steps, CPU)"
  "$B/meshtrain-run" -np 2 "${mpi[@]}" meshtrain "${train[@]}" "--job.dump_folder=$out/np2" > "$out/np2.log" 2>&1 ||
    { tail -20 "$out/np2.log"; return 1; }
  grep -c '"step"' "$out/np2/metrics.jsonl" | sed 's/^/metrics lines: /'
  step "[$label] meshtrain-run meshtrain train (1 rank, MPI singleton: no mpirun)"
  "$B/meshtrain-run" meshtrain "${train[@]}" "--job.dump_folder=$out/np1" > "$out/np1.log" 2>&1 ||
    { tail -20 "$out/np1.log"; return 1; }
  grep -c '"step"' "$out/np1/metrics.jsonl" | sed 's/^/metrics lines: /'
  step "[$label] LD_DEBUG=libs: where each rank's libraries come from (2 ranks, 1 step)"
  LD_DEBUG=libs LD_DEBUG_OUTPUT="$out/lddebug" "$B/meshtrain-run" -np 2 "${mpi[@]}" -- "${train[@]}" \
    --training.steps=1 "--job.dump_folder=$out/lddebug-run" > "$out/lddebug.log" 2>&1 ||
    { tail -20 "$out/lddebug.log"; return 1; }
  local loaded outside
  loaded=$(cat "$out"/lddebug.* | sed -n 's/.*calling init: \(.*\)$/\1/p' | sort -u)
  outside=$(echo "$loaded" | grep -v "^$B/" |
    grep -v -E '/(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libnss_[a-z]+\.so\.2|libtinfo\.so\.6)$' || true)
  echo "libraries initialised in the ranks and launchers: $(echo "$loaded" | wc -l), from the bundle: $(echo "$loaded" | grep -c "^$B/")"
  if [ -n "$outside" ]; then
    echo "$outside"
    return 1
  fi
  echo "none from outside the bundle except the glibc family"
}

step "clean environment: env -i PATH=/usr/bin:/bin HOME=/tmp"
env -i PATH=/usr/bin:/bin HOME=/tmp WORK="$work" B="$B" bash -c "$(declare -f step run_suite); work=\$WORK; set -eo pipefail; run_suite clean-env" ||
  fail "clean environment"

if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null; then
  step "no Open MPI, no libraries but glibc + the shell tools' (private mount namespace)"
  # Kept: the glibc family, and what bash, sed, grep and coreutils (this script's helpers) link.
  # The LD_DEBUG check above still allows only the glibc family and bash's libtinfo.
  keep="$work/minlib"
  rm -rf "$keep"
  mkdir -p "$keep"
  libdir=/usr/lib/x86_64-linux-gnu
  for f in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 \
           libutil.so.1 libnss_files.so.2 libnss_dns.so.2 libtinfo.so.6 libacl.so.1 libattr.so.1 libselinux.so.1 \
           libpcre2-8.so.0; do
    [ -e "$libdir/$f" ] && cp -L "$libdir/$f" "$keep/$f"
  done
  unshare --mount env -i PATH=/usr/bin:/bin HOME=/tmp WORK="$work" B="$B" KEEP="$keep" bash -c "
    set -eo pipefail
    mount --make-rprivate /
    for d in /etc/openmpi /usr/share/openmpi; do [ -d \$d ] && mount -t tmpfs tmpfs \$d; done
    for f in /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info; do [ -e \$f ] && mount --bind /dev/null \$f; done
    mount --bind \"\$KEEP\" $libdir    # last: mount itself needs the libraries it hides
    echo \"$libdir now holds:\" $libdir/*
    ! /usr/bin/mpirun --version >/dev/null 2>&1 || { echo 'the system mpirun still runs'; exit 1; }
    $(declare -f step run_suite)
    work=\$WORK
    run_suite no-system-libs
  " || fail "stripped mount namespace"
else
  echo "(not root or no unshare: the stripped-namespace check is skipped)"
fi
echo "check-bundle.sh: OK ($((SECONDS - t0)) s; outputs in $work)"
