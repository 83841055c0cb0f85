#!/usr/bin/env bash
# Installs the Debian packages meshtrain needs, only those missing; silent when all are present.
# Usage: scripts/install-deps.sh [build|test|run]   (each set includes the previous one)
# Without root (an HPC login node) it only reports what is missing; see README "Building without root".
set -euo pipefail
set_name=${1:-build}
build_pkgs=(g++ cmake make pkg-config libopenmpi-dev openmpi-bin libhdf5-openmpi-dev
  libboost-program-options-dev libboost-test-dev libopenblas-dev libsentencepiece-dev
  nlohmann-json3-dev libspdlog-dev libxxhash-dev libpcre2-dev libutf8proc-dev zlib1g-dev libjemalloc-dev)
test_pkgs=(npm python3-torch python3-h5py python3-numpy python3-matplotlib protobuf-compiler python3-protobuf python3-crc32c slurm-wlm munge)
run_pkgs=(npm)
case "$set_name" in
  build) pkgs=("${build_pkgs[@]}") ;;
  test) pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  run) pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}" "${run_pkgs[@]}") ;;
  *) echo "install-deps.sh: unknown set '$set_name' (build | test | run)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  # npm may come with a nodejs build that bundles it (and conflicts with Debian's npm package).
  if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps.sh: missing packages (not root or no apt-get, so not installing): ${missing[*]}" >&2
  echo "install-deps.sh: load your site's modules (MPI, parallel HDF5, Boost, OpenBLAS, SentencePiece) and CMake will find them." >&2
  exit 0
fi
echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
