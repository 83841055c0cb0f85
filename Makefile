# meshtrain top-level entry points. See README.md.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
NP ?= $(shell nproc)
DECK ?= inputs/llama3_debug.toml
CORPUS_H5 ?= data/brown.h5

.PHONY: all deps deps-test deps-run build test run corpus clean bench

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

clean:
	rm -rf $(BUILD_DIR)
