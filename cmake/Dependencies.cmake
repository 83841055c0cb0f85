# Every dependency comes from a system package (Debian) or a site installation found on
# CMAKE_PREFIX_PATH / PKG_CONFIG_PATH (environment modules, Spack). CUDA is never required.
find_package(PkgConfig REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options unit_test_framework)
find_package(nlohmann_json 3 REQUIRED)
find_package(spdlog REQUIRED)

# OpenBLAS: its pkg-config file gives the cblas header location on Debian.
pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
if(NOT OPENBLAS_FOUND)
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  add_library(meshtrain_blas INTERFACE)
  target_link_libraries(meshtrain_blas INTERFACE ${BLAS_LIBRARIES})
else()
  add_library(meshtrain_blas INTERFACE)
  target_link_libraries(meshtrain_blas INTERFACE PkgConfig::OPENBLAS)
endif()

# jemalloc (Debian's libjemalloc-dev) as the meshtrain binary's malloc: the planner's search makes
# millions of small allocations, which glibc's malloc serves ~1.4x slower (405B on 16,384 GPUs:
# 5.4-6.5 s of user time with glibc against 4.0-4.3 s with jemalloc, doc/plan.md). Optional:
# without it the binary keeps the C library's malloc.
pkg_check_modules(JEMALLOC IMPORTED_TARGET jemalloc)
add_library(meshtrain_malloc INTERFACE)
if(JEMALLOC_FOUND)
  target_link_libraries(meshtrain_malloc INTERFACE PkgConfig::JEMALLOC)
else()
  message(STATUS "jemalloc not found: meshtrain uses the C library's malloc (install libjemalloc-dev)")
endif()

# SentencePiece: pkg-config on Debian, else a plain library search.
pkg_check_modules(SENTENCEPIECE IMPORTED_TARGET sentencepiece)
add_library(meshtrain_sentencepiece INTERFACE)
if(SENTENCEPIECE_FOUND)
  target_link_libraries(meshtrain_sentencepiece INTERFACE PkgConfig::SENTENCEPIECE)
  find_library(SPM_TRAIN_LIB sentencepiece_train HINTS ${SENTENCEPIECE_LIBRARY_DIRS})
else()
  find_path(SPM_INCLUDE sentencepiece_processor.h REQUIRED)
  find_library(SPM_LIB sentencepiece REQUIRED)
  find_library(SPM_TRAIN_LIB sentencepiece_train REQUIRED)
  target_include_directories(meshtrain_sentencepiece INTERFACE ${SPM_INCLUDE})
  target_link_libraries(meshtrain_sentencepiece INTERFACE ${SPM_LIB})
endif()
target_link_libraries(meshtrain_sentencepiece INTERFACE ${SPM_TRAIN_LIB})

# Parallel HDF5 (MPI-IO): Debian's hdf5-openmpi pkg-config, else FindHDF5 with the parallel flavour.
pkg_check_modules(HDF5P IMPORTED_TARGET hdf5-openmpi)
add_library(meshtrain_hdf5 INTERFACE)
if(HDF5P_FOUND)
  target_link_libraries(meshtrain_hdf5 INTERFACE PkgConfig::HDF5P)
else()
  set(HDF5_PREFER_PARALLEL TRUE)
  find_package(HDF5 REQUIRED COMPONENTS C)
  if(NOT HDF5_IS_PARALLEL)
    message(FATAL_ERROR "meshtrain needs a parallel (MPI-IO) HDF5; found a serial one at ${HDF5_INCLUDE_DIRS}")
  endif()
  target_include_directories(meshtrain_hdf5 INTERFACE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(meshtrain_hdf5 INTERFACE ${HDF5_LIBRARIES})
endif()
target_link_libraries(meshtrain_hdf5 INTERFACE MPI::MPI_C)

# xxHash (checkpoint shard checksums, XXH3-64).
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
add_library(meshtrain_xxhash INTERFACE)
target_link_libraries(meshtrain_xxhash INTERFACE PkgConfig::XXHASH)

# Tokenizers (src/data): PCRE2 with its JIT runs the pre-tokenizer regexes, utf8proc does NFC,
# zlib reads gzip-compressed JSON Lines corpora.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
find_package(ZLIB REQUIRED)
add_library(meshtrain_text INTERFACE)
target_link_libraries(meshtrain_text INTERFACE PkgConfig::PCRE2 PkgConfig::UTF8PROC ZLIB::ZLIB)

find_program(MPIEXEC_BIN NAMES mpirun mpiexec REQUIRED)
# Debian's Python with torch/h5py/numpy; the first python3 on PATH may be another interpreter.
find_program(MESHTRAIN_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)

# CUDA + NCCL (optional): the toolkit at /usr/local/cuda or CUDAToolkit_ROOT. Never required
# unless MESHTRAIN_CUDA=ON. When found, the CUDA backend (src/device/cuda) and the NCCL
# communicators are compiled for sm_90 (H100 / H200) and sm_80 (A100).
set(MESHTRAIN_HAVE_NCCL OFF)
set(MESHTRAIN_HAVE_CUDA OFF)
if(NOT MESHTRAIN_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND TARGET CUDA::cublasLt)
    if(NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    endif()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 knows no C++20 dialect flag for nvcc (nvcc 12+ accepts -std=c++20): name it, so
    # the CUDA targets get the same standard as the C++ ones.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(MESHTRAIN_HAVE_CUDA ON)
    set(MESHTRAIN_HAVE_NCCL ON)
    add_library(meshtrain_nccl_lib INTERFACE)
    target_include_directories(meshtrain_nccl_lib INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(meshtrain_nccl_lib INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
    message(STATUS "meshtrain: CUDA ${CUDAToolkit_VERSION} and NCCL found (${NCCL_LIBRARY}); "
                   "CUDA backend for sm_${CMAKE_CUDA_ARCHITECTURES}")
  elseif(MESHTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON but the CUDA toolkit, cuBLASLt or NCCL was not found")
  else()
    message(STATUS "meshtrain: CUDA/NCCL not found; building without them")
  endif()
endif()
