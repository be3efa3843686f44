# Thin wrapper over CMake. `make demo` and `make test` do all set-up on a fresh Debian machine.
BUILD ?= build
JOBS ?= $(shell nproc)
DEB_PKGS := cmake g++ make pkg-config libomp-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev \
            libopenblas-dev libpcre2-dev libutf8proc-dev libgtest-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps configure build test demo clean

all: build

# Installs the Debian packages that are missing (needs root or sudo); a no-op when all are present.
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

demo: build
	./$(BUILD)/qlora train examples/tiny.yaml output_dir=runs/tiny

clean:
	rm -rf $(BUILD)
