# glm5-shard build. `make` builds everything into build/ (binaries in build/bin/);
# `make test` runs the include layering check and the CPU suite; `make check` runs it under ASan+UBSan; `make fuzz` runs the
# libFuzzer targets for FUZZ_SECONDS each. No GPU is needed for any of these.

CC       ?= gcc
BUILD    ?= build
OPT      ?= -O2
CFLAGS   := -std=c11 -D_GNU_SOURCE -ffp-contract=off $(OPT) -g -Wall -Wextra -Werror -pthread -I. -MMD -MP $(EXTRA_CFLAGS)
LDFLAGS  := -pthread $(EXTRA_LDFLAGS)
LDLIBS   := -lxxhash -lzstd -lpcre2-8 -ljansson -lm

# Sanitizer build used by `make check`.
ifeq ($(SAN),1)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

FORMAT_SRC  := $(wildcard format/*.c)
CONVERT_SRC := $(filter-out convert/main_%.c,$(wildcard convert/*.c))
# runtime/ is one archive of its rooms (cpu, gpu, text, serve) and the engine layer above them;
# runtime/cli holds the programs' main()s.
RUNTIME_SRC := $(wildcard runtime/*.c runtime/cpu/*.c runtime/gpu/*.c runtime/text/*.c runtime/serve/*.c)
TEST_SRC    := $(wildcard tests/test_*.c)
FUZZ_SRC    := $(wildcard fuzz/fuzz_*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB_FORMAT  := $(BUILD)/lib/libg5format.a
LIB_CONVERT := $(BUILD)/lib/libg5convert.a
LIB_RUNTIME := $(BUILD)/lib/libg5runtime.a
LIBS        := $(LIB_RUNTIME) $(LIB_CONVERT) $(LIB_FORMAT)

BINS  := $(BUILD)/bin/glm5-shard
ifneq ($(wildcard runtime/cli/main_run.c),)
BINS  += $(BUILD)/bin/glm5-run
endif
# glm5-serve (runtime/serve/serve*.c) uses libmicrohttpd; every link gets it because the fuzz targets
# and tests link the runtime sources/archive as a whole.
ifneq ($(wildcard runtime/serve/serve*.c),)
LDLIBS += -lmicrohttpd
endif
ifneq ($(wildcard runtime/cli/main_serve.c),)
BINS  += $(BUILD)/bin/glm5-serve
endif
# A fresh clone on a fresh machine: every build goal first probes the headers (and Open MPI)
# and, when one is missing, runs scripts/deps.sh (before MPI is detected below). Quiet when all
# are present. If the install fails (no root, no network) the build goes on and says what is
# missing; G5_NO_DEPS=1 skips the probe.
DEPS_GOALS := all test check fuzz gpu gpu-model test-gpu bench-gpu
ifneq ($(filter $(DEPS_GOALS),$(or $(MAKECMDGOALS),all)),)
ifneq ($(G5_NO_DEPS),1)
DEPS_RC := $(shell CC='$(CC)' EXTRA_CFLAGS='$(EXTRA_CFLAGS)' MPI='$(MPI)' G5_MPI_HOME='$(G5_MPI_HOME)' bash scripts/deps.sh --if-missing >&2 || echo failed)
ifeq ($(DEPS_RC),failed)
$(warning scripts/deps.sh could not install the build's dependencies (see above); run it as root)
endif
endif
endif

# MPI (runtime/cpu/comm.c: several processes under mpirun/srun) when pkg-config finds Open MPI
# (ompi-c) or another `mpi` package; `make MPI=0` builds without it (the GPU machines have
# none of their own: see G5_MPI_HOME below). Only comm.c sees mpi.h; every program linking the
# runtime gets MPI_LIBS. Changing MPI needs a clean BUILD (comm.o does not track it).
# G5_MPI_HOME=DIR (set by DIR/env.sh: the Open MPI bundle of scripts/gpu-mpi.sh, for machines
# that may lack pkg-config) takes mpi.h and libmpi.so.40 from DIR instead; the rpath lets the
# programs start outside mpirun without DIR/lib in LD_LIBRARY_PATH (under mpirun env.sh is needed).
MPI ?= auto
ifneq ($(MPI),0)
ifneq ($(G5_MPI_HOME),)
MPI_HOME_LIB := $(abspath $(G5_MPI_HOME))/lib
MPI_CFLAGS := -DG5_WITH_MPI -isystem $(G5_MPI_HOME)/include
MPI_LIBS   := -L$(MPI_HOME_LIB) -Wl,-rpath-link,$(MPI_HOME_LIB) -Wl,-rpath,$(MPI_HOME_LIB) -l:libmpi.so.40
else
MPI_PKG := $(shell pkg-config --exists ompi-c 2>/dev/null && echo ompi-c || { pkg-config --exists mpi 2>/dev/null && echo mpi; })
endif
endif
ifneq ($(MPI_PKG),)
MPI_CFLAGS := -DG5_WITH_MPI $(patsubst -I%,-isystem %,$(shell pkg-config --cflags $(MPI_PKG)))
MPI_LIBS   := $(shell pkg-config --libs $(MPI_PKG))
endif
LDLIBS += $(MPI_LIBS)
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

.PHONY: all test check fuzz demo clean deps
all: $(BINS) $(TESTS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/runtime/cpu/comm.o: CFLAGS += $(MPI_CFLAGS)

$(LIB_FORMAT): $(call obj,$(FORMAT_SRC))
$(LIB_CONVERT): $(call obj,$(CONVERT_SRC))
$(LIB_RUNTIME): $(call obj,$(RUNTIME_SRC))
$(LIBS):
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/glm5-shard: $(call obj,convert/main_shard.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/glm5-run: $(call obj,runtime/cli/main_run.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/glm5-serve: $(call obj,runtime/cli/main_serve.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# The include layering check (scripts/check_includes.sh) and the GPU runtime's stream check
# (scripts/check_gpu_streams.sh: no synchronous legacy-stream copies), each with its self-test,
# run first.
test: all
	@bash scripts/check_includes.sh
	@bash scripts/check_gpu_streams.sh
	@BUILD=$(BUILD) bash scripts/run_tests.sh $(TESTS)

# `make check` also runs tests/gpu/load_stub (runtime/gpu/gpu_load.c's threads against a CUDA stub,
# under ASan+UBSan, no GPU) where the CUDA headers are installed; without them it says so.
LOAD_STUB_CUDA_H := $(firstword $(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h /usr/local/cuda/include/cuda_runtime_api.h /usr/include/cuda_runtime_api.h))
check:
	$(MAKE) BUILD=build/asan SAN=1 OPT=-O1 test
	@if [ -n "$(LOAD_STUB_CUDA_H)" ]; then \
	  B=build/asan SAN=address,undefined CUDA_HOME=$(patsubst %/include/cuda_runtime_api.h,%,$(LOAD_STUB_CUDA_H)) \
	    bash tests/gpu/load_stub/run.sh >build/asan/load_stub.log 2>&1; rc=$$?; \
	  tail -1 build/asan/load_stub.log; [ $$rc -eq 0 ] || { grep FAIL build/asan/load_stub.log | head -20; exit 1; }; \
	else echo "check_load: skipped: no cuda_runtime_api.h (tests/gpu/load_stub needs the CUDA headers, not a GPU)"; fi

# libFuzzer targets: each links the library sources compiled by clang with the fuzzer runtime.
FUZZ_SECONDS ?= 30
FUZZ_BINS := $(patsubst fuzz/%.c,build/fuzz/%,$(FUZZ_SRC))
build/fuzz/%: fuzz/%.c $(FORMAT_SRC) $(CONVERT_SRC) $(RUNTIME_SRC)
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -ffp-contract=off -O1 -g -I. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $^ $(LDLIBS) -pthread -o $@
fuzz: $(FUZZ_BINS)
	@set -e; for f in $(FUZZ_BINS); do \
	  name=$$(basename $$f); mkdir -p build/fuzz/corpus-$$name; \
	  seeds=""; [ -d fuzz/seeds/$$name ] && seeds=fuzz/seeds/$$name; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS)s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -print_final_stats=0 \
	      build/fuzz/corpus-$$name $$seeds 2>build/fuzz/$$name.log || { tail -40 build/fuzz/$$name.log; exit 1; }; \
	  grep -E "Done [0-9]+ runs" build/fuzz/$$name.log || true; \
	done

deps:
	bash scripts/deps.sh

demo:
	bash scripts/demo.sh

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# CUDA targets (`make gpu`, `make test-gpu`) live in cuda/cuda.mk; they need nvcc and are never
# part of `make`/`make test`, so CI runs without a GPU.
-include cuda/cuda.mk
