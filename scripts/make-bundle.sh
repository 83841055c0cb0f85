#!/usr/bin/env bash
# Packs a built meshtrain into a relocatable tarball for GPU nodes that lack our Debian packages
# or network access: BUILD_DIR/meshtrain-bundle-<version>-<commit>[-dirty].tar.gz holding
#   bin/       meshtrain; Open MPI's mpirun (orterun), orted, ompi_info
#   lib/       every shared library they and the plugins below need, found by following each
#              ELF file's DT_NEEDED entries recursively and resolving them with ldd — except the
#              libraries every node provides itself: the glibc family (libc, libm, libdl,
#              libpthread, librt, ld-linux, ...), the NVIDIA driver (libcuda, libnvidia-*) and
#              rdma-core (libibverbs, librdmacm, providers). libstdc++, libgcc_s and libgomp ARE
#              bundled (the node may run an older distribution). CUDA runtime libraries (cudart,
#              cuBLAS(Lt), NCCL) are bundled unless BUNDLE_CUDA_LIBS=0.
#   lib/openmpi/  Open MPI's MCA plugins;  lib/pmix/  PMIx plugins;  lib/hwloc/  hwloc's PCI plugin;
#   lib/ucx/   UCX transport modules
#   share/openmpi/, share/pmix/   help files;   etc/   openmpi-mca-params.conf, pmix-mca-params.conf
#   meshtrain-run   the launcher (scripts/bundle/meshtrain-run);  README.md;  BUILDINFO;
#   MANIFEST   sha256 of every other file (`sha256sum -c MANIFEST` inside the bundle)
#
# usage: scripts/make-bundle.sh [BUILD_DIR]       (or BUILD_DIR=... ; default build)
# env:   BUNDLE_CUDA_LIBS=1|0   bundle the CUDA runtime libraries (default 1; 0 for nodes with the
#                               toolkit, and for transfers limited in size: cuBLASLt alone is ~500 MB)
#        BUNDLE_VERSION=STR     replaces <version>-<commit>[-dirty] in the name
#        BUNDLE_OUT=DIR         where the tarball goes (default BUILD_DIR)
#        BUNDLE_TESTS=1|0       also bin/ the GPU test programs scripts/gpu-session.sh runs
#                               (test_cuda_*, nccl_mesh_smoke, dump_grads: `cmake --build
#                               BUILD_DIR --target gpu-tests`; default 0). Built with
#                               -DMESHTRAIN_SHARED_LIBS=ON the CUDA kernels are in lib/ once.
# Needs bash, ldd, objdump (binutils), sha256sum, tar, gzip, and Open MPI's ompi_info on PATH
# (the Open MPI meshtrain was linked against).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${BUILD_DIR:-build}}
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
cuda_libs=${BUNDLE_CUDA_LIBS:-1}
out_dir=${BUNDLE_OUT:-$build}
t_start=$SECONDS

die() { echo "make-bundle.sh: $*" >&2; exit 1; }
note() { echo "make-bundle.sh: $*" >&2; }

bin="$build/bin/meshtrain"
[ -x "$bin" ] || die "$bin not found: build first (make build, or cmake --build $build)"
for tool in ldd objdump strings sha256sum tar gzip ompi_info; do
  command -v "$tool" >/dev/null || die "'$tool' is needed and not on PATH"
done
case "$cuda_libs" in 0 | 1) ;; *) die "BUNDLE_CUDA_LIBS must be 0 or 1, not '$cuda_libs'" ;; esac
tests=${BUNDLE_TESTS:-0}
case "$tests" in 0 | 1) ;; *) die "BUNDLE_TESTS must be 0 or 1, not '$tests'" ;; esac

# ---- name: <project version>-<short commit>[-dirty] ----
if [ -n "${BUNDLE_VERSION:-}" ]; then
  version=$BUNDLE_VERSION
else
  version=$(sed -n 's/^project(meshtrain VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo nogit)
  version="${version:-0}-$commit"
  if [ "$commit" != nogit ] && ! git -C "$root" diff --quiet HEAD -- 2>/dev/null; then version="$version-dirty"; fi
fi
name="meshtrain-bundle-$version"
stage_root="$build/bundle-stage"
stage="$stage_root/$name"
rm -rf "$stage_root"
mkdir -p "$stage"/{bin,lib/openmpi,lib/pmix,lib/hwloc,lib/ucx,share/openmpi,share/pmix,etc}

# ---- what is never bundled (sonames) ----
# glibc family: the node's own libc must match its loader and kernel.
system_re='^(linux-vdso|linux-gate|ld-linux[-a-z0-9_]*|libc|libm|libmvec|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|libcrypt|libBrokenLocale|libthread_db|libnss_[a-z0-9]+|libc_malloc_debug|libmemusage|libpcprofile)\.so'
# NVIDIA driver: must match the node's kernel module.  rdma-core: tied to the node's HCA drivers
# and their provider plugins (NCCL and UCX dlopen the node's libibverbs).
host_re='^(libcuda|libcudadebugger|libnvidia-[a-z0-9_-]+|libnvcuvid|libibverbs|librdmacm|libmlx[45]|libefa|libhns|libibumad|libibmad|libmana)\.so'
# CUDA toolkit runtime libraries (BUNDLE_CUDA_LIBS=0 leaves them to the node's toolkit).
cuda_re='^(libcudart|libcublas|libcublasLt|libnccl|libnvJitLink|libnvrtc|libnvrtc-builtins|libcufft|libcurand|libcusparse|libcusolver|libcupti|libnvToolsExt|libnvtx3interop|libcudnn[a-z_]*)\.so'

declare -A bundled=()   # soname -> source path (already copied into lib/)
declare -A libpath=()   # soname -> path, as ldd resolved it for some file that needs it
declare -A skipped=()   # soname -> why it was left out
missing=()

# The source path of the bundled library whose soname matches the regex $1 (empty if none).
bundled_like() {
  local k
  for k in "${!bundled[@]}"; do
    if [[ $k =~ $1 ]]; then echo "${bundled[$k]}"; return 0; fi
  done
}

# Bundles what the ELF files $@ need: their DT_NEEDED entries (objdump -p), each resolved the way
# the loader resolves it (ldd on the files, with their RUNPATH and the environment; ldd lists
# the whole closure, so the libraries found on the way resolve too), copied to lib/ under its
# soname unless excluded above, and followed in turn until nothing new appears. Batched: one
# ldd and one objdump per round, not per file.
walk() {
  local line dep path file
  local -a next
  while IFS= read -r line; do
    case "$line" in
      *" => /"*) dep=${line%% =>*}; dep=${dep//[[:space:]]/}; path=${line#*=> }; path=${path%% (*}
                 [ -n "${libpath[$dep]:-}" ] || libpath[$dep]=$path ;;
    esac
  done < <(ldd "$@" 2>/dev/null || true)
  while [ $# -gt 0 ]; do
    next=()
    while read -r file dep; do
      if [[ $dep =~ $system_re ]]; then continue; fi
      if [[ $dep =~ $host_re ]]; then skipped[$dep]="provided by the node (driver / rdma-core)"; continue; fi
      if [ "$cuda_libs" = 0 ] && [[ $dep =~ $cuda_re ]]; then skipped[$dep]="CUDA toolkit (BUNDLE_CUDA_LIBS=0)"; continue; fi
      [ -z "${bundled[$dep]:-}" ] || continue
      path=${libpath[$dep]:-}
      if [ -z "$path" ] || [ ! -e "$path" ]; then
        missing+=("$dep (needed by ${file#"$stage"/})")
        continue
      fi
      cp -L "$path" "$stage/lib/$dep"
      chmod u+w,a+r "$stage/lib/$dep"
      bundled[$dep]=$path
      next+=("$stage/lib/$dep")
    done < <(objdump -p "$@" 2>/dev/null | awk '/:[ \t]+file format / {f = $1; sub(/:$/, "", f)} $1 == "NEEDED" {print f, $2}')
    set -- ${next[@]+"${next[@]}"}
  done
}

# ---- Open MPI: where meshtrain's libmpi comes from, and that installation's folders ----
ompi_path() { ompi_info --parsable --path "$1" | sed -n "s/^path:$1://p"; }
ompi_bindir=$(ompi_path bindir)
ompi_pkglibdir=$(ompi_path pkglibdir)
ompi_pkgdatadir=$(ompi_path pkgdatadir)
ompi_sysconfdir=$(ompi_path sysconfdir)
ompi_version=$(ompi_info --version 2>/dev/null | sed -n "s/^Open MPI v//p" | head -1)
[ -d "$ompi_pkglibdir" ] || die "Open MPI's plugin folder '$ompi_pkglibdir' (ompi_info --path pkglibdir) is missing"
mt_libmpi=$(ldd "$bin" | awk '$1 ~ /^libmpi\.so/ {print $3}')
info_libmpi=$(ldd "$(command -v ompi_info)" | awk '$1 ~ /^libmpi\.so/ {print $3}')
[ -n "$mt_libmpi" ] || die "$bin does not link libmpi (or ldd cannot resolve it)"
if [ -n "$info_libmpi" ] && [ "$(readlink -f "$mt_libmpi")" != "$(readlink -f "$info_libmpi")" ]; then
  die "meshtrain links $mt_libmpi but the ompi_info on PATH uses $info_libmpi: put the matching Open MPI first on PATH"
fi

# ---- bin/ ----
install -m 0755 "$bin" "$stage/bin/meshtrain"
if [ "$tests" = 1 ]; then
  found=0
  for prog in "$build"/tests/test_cuda_* "$build"/tests/nccl_mesh_smoke "$build"/tests/dump_grads; do
    [ -x "$prog" ] || continue
    install -m 0755 "$prog" "$stage/bin/${prog##*/}"
    found=$((found + 1))
  done
  [ $found -gt 0 ] || die "BUNDLE_TESTS=1 but no test program in $build/tests: cmake --build $build --target gpu-tests"
fi
launcher=""
for exe in orterun prterun; do
  [ -x "$ompi_bindir/$exe" ] && launcher=$exe && break
done
[ -n "$launcher" ] || die "neither orterun nor prterun in $ompi_bindir (Open MPI's bindir)"
[ "$launcher" = orterun ] || note "warning: $launcher found: Open MPI 5 (PRRTE) has its own plugin folders, which this script does not relocate"
for exe in orterun orted prterun prted prte ompi_info; do
  if [ -x "$ompi_bindir/$exe" ]; then
    cp -L "$ompi_bindir/$exe" "$stage/bin/$exe"
  fi
done
ln -s "$launcher" "$stage/bin/mpirun"
ln -s "$launcher" "$stage/bin/mpiexec"
[ -e "$stage/bin/orted" ] || [ -e "$stage/bin/prted" ] || die "neither orted nor prted in $ompi_bindir"

# ---- Open MPI plugins, help files, parameter files ----
cp -L "$ompi_pkglibdir"/*.so "$stage/lib/openmpi/"
# ldd runs on the originals (their RUNPATH, e.g. $ORIGIN, must see their own folder).
walk "$stage"/bin/* "$ompi_pkglibdir"/*.so
cp -RL "$ompi_pkgdatadir"/. "$stage/share/openmpi/"
rm -f "$stage"/share/openmpi/*-wrapper-data.txt   # compiler wrappers are not bundled
for f in openmpi-mca-params.conf openmpi-default-hostfile; do
  [ -f "$ompi_sysconfdir/$f" ] && cp -L "$ompi_sysconfdir/$f" "$stage/etc/$f"
done
[ -f "$stage/etc/openmpi-mca-params.conf" ] || : > "$stage/etc/openmpi-mca-params.conf"

# ---- PMIx: the external libpmix the ext3x/ext4x plugin links, and its plugin folder ----
pmix_lib=$(bundled_like '^libpmix\.so')
if [ -n "$pmix_lib" ]; then
  pmix_real=$(readlink -f "$pmix_lib")
  pmix_plugins=""
  # Its compiled-in libdir (a string in the library) + /pmix, else beside the library.
  for d in $(strings "$pmix_real" 2>/dev/null | grep -E '^/[^ ]*/lib$' | sort -u) "$(dirname "$pmix_real")"; do
    if compgen -G "$d/pmix/pmix_mca_*.so" >/dev/null; then pmix_plugins="$d/pmix"; break; fi
  done
  if [ -n "$pmix_plugins" ]; then
    cp -L "$pmix_plugins"/*.so "$stage/lib/pmix/"
    walk "$pmix_plugins"/*.so
    pmix_prefix=$(dirname "$(dirname "$pmix_plugins")")
    [ -d "$pmix_prefix/share/pmix" ] && cp -RL "$pmix_prefix/share/pmix"/. "$stage/share/pmix/"
    for conf in "$pmix_prefix/etc/pmix-mca-params.conf" "$pmix_prefix/share/pmix-mca-params.conf"; do
      if [ -f "$conf" ]; then
        # The launcher sets the plugin path (PMIX_MCA_mca_base_component_path); a path fixed in
        # the file would point at the build machine.
        sed 's/^\([[:space:]]*mca_base_component_path[[:space:]]*=.*\)$/# meshtrain bundle: set by meshtrain-run\n# \1/' \
          "$conf" > "$stage/etc/pmix-mca-params.conf"
        break
      fi
    done
  else
    note "warning: PMIx plugin folder not found near $pmix_real; PMIx runs with its built-in components only"
  fi
fi

# ---- hwloc: the PCI discovery plugin only (the GL / OpenCL / libxml2 ones pull in X11 and ICU) ----
hwloc_lib=$(bundled_like '^libhwloc\.so')
if [ -n "$hwloc_lib" ] && [ -f "$(dirname "$(readlink -f "$hwloc_lib")")/hwloc/hwloc_pci.so" ]; then
  so="$(dirname "$(readlink -f "$hwloc_lib")")/hwloc/hwloc_pci.so"
  cp -L "$so" "$stage/lib/hwloc/"
  walk "$so"
fi

# ---- UCX transport modules: UCX looks for them in <folder of libucs>/ucx ----
ucs_lib=$(bundled_like '^libucs\.so')
if [ -n "$ucs_lib" ] && [ -d "$(dirname "$(readlink -f "$ucs_lib")")/ucx" ]; then
  cp -L "$(dirname "$(readlink -f "$ucs_lib")")"/ucx/*.so.[0-9] "$stage/lib/ucx/"
  walk "$(dirname "$(readlink -f "$ucs_lib")")"/ucx/*.so.[0-9]
fi

if [ ${#missing[@]} -gt 0 ]; then
  printf '  %s\n' "${missing[@]}" | sort -u >&2
  die "the libraries above are needed but ldd cannot find them on this machine"
fi
if [ "$cuda_libs" = 1 ]; then
  : > "$stage/lib/.cuda-libs-bundled"
fi

# ---- launcher, README, BUILDINFO, MANIFEST ----
install -m 0755 "$root/scripts/bundle/meshtrain-run" "$stage/meshtrain-run"
cp "$root/scripts/bundle/README.md" "$stage/README.md"
# The newest glibc symbol version any bundled file needs: the oldest glibc the bundle runs on.
glibc_required=$( { find "$stage/bin" "$stage/lib" -type f -size +0 -exec objdump -T {} + 2>/dev/null || true; } |
  { grep -o 'GLIBC_[0-9][0-9.]*' || true; } | sed 's/GLIBC_//' | sort -V | tail -1)
{
  echo "name=$name"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "build_dir=$build"
  echo "build_host=$(uname -n) ($(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(uname -m))"
  echo "glibc_required=$glibc_required"
  echo "open_mpi=$ompi_version ($launcher, plugins from $ompi_pkglibdir)"
  echo "cuda_libs_bundled=$cuda_libs"
  for k in "${!skipped[@]}"; do echo "not_bundled=$k: ${skipped[$k]}"; done | sort
  for k in "${!bundled[@]}"; do echo "lib=$k <- ${bundled[$k]}"; done | sort
} > "$stage/BUILDINFO"
(cd "$stage" && find . -type f ! -name MANIFEST -printf '%P\n' | LC_ALL=C sort | tr '\n' '\0' |
  xargs -0 sha256sum) > "$stage_root/MANIFEST"
mv "$stage_root/MANIFEST" "$stage/MANIFEST"

mkdir -p "$out_dir"
tarball="$out_dir/$name.tar.gz"
tar -C "$stage_root" --sort=name --owner=0 --group=0 --numeric-owner -cf - "$name" | gzip -n -6 > "$tarball.tmp"
mv "$tarball.tmp" "$tarball"
(cd "$out_dir" && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")
rm -rf "$stage_root"
size=$(du -h "$tarball" | cut -f1)
echo "make-bundle.sh: $tarball ($size, ${#bundled[@]} libraries, CUDA libraries $([ "$cuda_libs" = 1 ] && echo bundled || echo "left to the node"), needs glibc >= $glibc_required; $((SECONDS - t_start)) s)"
