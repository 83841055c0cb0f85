# meshtrain top-level entry points. See README.md.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
NP ?= $(shell nproc)
DECK ?= inputs/llama3_debug.toml
CORPUS_H5 ?= data/brown.h5
PYTHON ?= python3

.PHONY: all deps deps-test deps-run build test run corpus clean bench bundle bundle-check gpu-bench gpu-session-bundle

all: build

deps:
	@scripts/install-deps.sh build
deps-test:
	@scripts/install-deps.sh test
deps-run:
	@scripts/install-deps.sh run

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: deps-test $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)
	cd $(BUILD_DIR) && ctest --output-on-failure -j 1

corpus: deps-run build
	@scripts/fetch-brown.sh data/brown
	@[ -f $(CORPUS_H5) ] || $(BUILD_DIR)/bin/meshtrain data prepare --input data/brown/text --output $(CORPUS_H5) --vocab-size 2048

run: deps-run build corpus
	mpirun --allow-run-as-root --oversubscribe --quiet -np $(NP) $(BUILD_DIR)/bin/meshtrain train --deck $(DECK) \
	  --parallelism.data_parallel_replicate_degree=$(NP) $(ARGS)

bench: build
	/usr/bin/python3 perf/cpu_step_bench.py

# Relocatable tarball for GPU nodes: $(BUNDLE_BUILD_DIR)/meshtrain-bundle-<version>-<commit>.tar.gz
# (scripts/make-bundle.sh; BUNDLE_CUDA_LIBS=0 leaves cudart/cuBLAS/NCCL to the node's toolkit).
# Built apart, without -march=native, so the binary runs on the GPU nodes' CPUs as well.
BUNDLE_BUILD_DIR ?= build-portable
bundle: deps
	cmake -S . -B $(BUNDLE_BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_NATIVE=OFF
	cmake --build $(BUNDLE_BUILD_DIR) -j $(JOBS) --target meshtrain
	scripts/make-bundle.sh $(BUNDLE_BUILD_DIR)

# Unpacks the newest bundle and runs it with an empty environment (and, as root, in a mount
# namespace without the system's Open MPI and libraries): scripts/check-bundle.sh.
bundle-check: bundle
	scripts/check-bundle.sh "$$(ls -t $(BUNDLE_BUILD_DIR)/meshtrain-bundle-*.tar.gz | head -1)"

# The bundle scripts/gpu-session.sh runs on a GPU machine: shared module libraries (the CUDA
# kernels in one library), sm_90 only, with the GPU test programs (doc/performance.md).
gpu-session-bundle: deps
	cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_SHARED_LIBS=ON -DMESHTRAIN_NATIVE=OFF \
	  -DCMAKE_CUDA_ARCHITECTURES=90 -DMESHTRAIN_CUDA=ON
	cmake --build build-gpu -j $(JOBS) --target gpu-tests
	BUNDLE_TESTS=1 BUNDLE_CUDA_LIBS=0 scripts/make-bundle.sh build-gpu

# One-GPU benchmark: meshtrain vs PyTorch eager and torch.compile on the Llama 3.2 1B shape
# (perf/gpu_step_bench.py; needs a CUDA build and a GPU).
gpu-bench: build
	$(PYTHON) perf/gpu_step_bench.py --build $(BUILD_DIR) $(ARGS)

clean:
	rm -rf $(BUILD_DIR)
