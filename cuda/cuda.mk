# CUDA targets, included by the top Makefile. Never part of `all`/`test`: CI has no GPU.
#   make gpu        builds $(BUILD)/gpu/libg5cuda.a and the GPU test/bench programs
#   make test-gpu   runs the GPU tests (tests/gpu/test_*.c), `N passed, N failed` last
# One binary for the devices in the field: SASS for every CUDA_ARCH (default 90 = Hopper H100/H200
# and 120 = Blackwell RTX PRO 6000) plus PTX of CUDA_PTX (default the first, compute_90) that the
# driver compiles for anything newer. `make gpu CUDA_ARCH=90` builds one target (faster to
# compile); objects are rebuilt when the choice changes. NVCC and CUDA_HOME may be overridden.
# Every kernel's shared memory and cluster size fit both targets or are chosen from the device
# at start-up (cuda/cuk_device.h; tests/test_kernel_limits checks the table against sm_120).

NVCC      ?= nvcc
CUDA_ARCH ?= 90 120
CUDA_PTX  ?= $(firstword $(CUDA_ARCH))
CUDA_PTX_GENCODE := -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX)
CUDA_GENCODE := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) $(if $(CUDA_PTX),$(CUDA_PTX_GENCODE))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
# cuBLAS (cuda/gemm.cu) by its unversioned name where a development link exists, else the
# runtime's soname (a machine with only libcublas.so.13 installed)
CUBLAS_LINK ?= $(if $(wildcard $(CUDA_HOME)/lib64/libcublas.so /usr/lib/x86_64-linux-gnu/libcublas.so /usr/lib64/libcublas.so),-lcublas,-l:libcublas.so.13)
NVCCFLAGS := -std=c++17 -O3 $(CUDA_GENCODE) -I. \
             -Xcompiler -Wall,-Wextra,-Wno-unknown-pragmas,-ffp-contract=off -Werror all-warnings -MMD -MP \
             $(EXTRA_NVCCFLAGS)

GPU_DIR        := $(BUILD)/gpu
GPU_LIB        := $(GPU_DIR)/libg5cuda.a
CUDA_SRC       := $(wildcard cuda/*.cu)
CUDA_OBJ       := $(patsubst %.cu,$(GPU_DIR)/obj/%.o,$(CUDA_SRC))
GPU_TEST_SRC   := $(wildcard tests/gpu/test_*.c)
GPU_TEST_CU    := $(wildcard tests/gpu/test_*.cu)
GPU_BENCH_SRC  := $(wildcard tests/gpu/bench_*.c)
GPU_BENCH_CU   := $(wildcard tests/gpu/bench_*.cu)
GPU_TESTS      := $(patsubst tests/gpu/%.c,$(GPU_DIR)/tests/%,$(GPU_TEST_SRC)) \
                  $(patsubst tests/gpu/%.cu,$(GPU_DIR)/tests/%,$(GPU_TEST_CU))
GPU_BENCHES    := $(patsubst tests/gpu/%.c,$(GPU_DIR)/tests/%,$(GPU_BENCH_SRC)) \
                  $(patsubst tests/gpu/%.cu,$(GPU_DIR)/tests/%,$(GPU_BENCH_CU))

.PHONY: gpu test-gpu bench-gpu
gpu: $(GPU_LIB) $(GPU_TESTS) $(GPU_BENCHES)

# A stamp named after the targets: CUDA objects depend on it, so a new CUDA_ARCH/CUDA_PTX rebuilds them.
GPU_ARCH_STAMP := $(GPU_DIR)/arch-sm$(subst $(eval) ,-,$(strip $(CUDA_ARCH)))-ptx$(CUDA_PTX).stamp
$(GPU_ARCH_STAMP):
	@mkdir -p $(dir $@)
	@rm -f $(GPU_DIR)/arch-*.stamp && touch $@

$(GPU_DIR)/obj/cuda/%.o: cuda/%.cu $(GPU_ARCH_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(GPU_LIB): $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Host test programs are C11, compiled like the rest of the tree, linked by nvcc (cudart).
$(GPU_DIR)/obj/tests/gpu/%.o: tests/gpu/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -c $< -o $@

# Test and benchmark programs in CUDA C++ (kernel headers checked on the host; probe kernels).
$(GPU_DIR)/obj/tests/gpu/%.o: tests/gpu/%.cu $(GPU_ARCH_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# Only the format/ objects cuda/ and the tests use (no xxhash/zstd/jansson needed on a GPU box).
GPU_FORMAT_OBJ := $(BUILD)/obj/format/quant.o $(BUILD)/obj/format/quant_lowbit.o $(BUILD)/obj/format/status.o

$(GPU_DIR)/tests/%: $(GPU_DIR)/obj/tests/gpu/%.o $(GPU_LIB) $(GPU_FORMAT_OBJ)
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_GENCODE) $(filter-out %.stamp,$^) $(CUBLAS_LINK) -lm -lpthread -o $@

# cuk_sample's test draws with the host sampler too
$(GPU_DIR)/tests/test_gpu_sample: $(BUILD)/obj/runtime/text/sample.o

# One verdict: every GPU test program, then tests/gpu/oracle_cli.sh (glm5-run --device cuda on the
# oracle: greedy equality, --check verdicts, graph/draft/TP 2/NCCL variants, as assertions), the
# grand total `N passed, N failed` last, non-zero exit on any failure. Per-case lines of the GPU
# tests also go to $(GPU_DIR)/test-gpu-detail.log, the glm5-run reports to $(GPU_DIR)/oracle_cli/.
# G5_TEST_TOL_SCALE=1e-9 make test-gpu plants a tolerance the precise runs cannot meet (it fails).
# TEST_JOBS=8 runs the programs side by side (scripts/run_tests.sh; the report keeps the order).
test-gpu: gpu gpu-model $(BUILD)/bin/glm5-shard
	@rm -f $(GPU_DIR)/test-gpu-detail.log
	@G5_TEST_DETAIL=$(abspath $(GPU_DIR))/test-gpu-detail.log OUT=$(abspath $(GPU_DIR))/oracle_cli BUILD=$(BUILD) \
	  bash scripts/run_tests.sh $(GPU_TESTS) tests/gpu/oracle_cli.sh

bench-gpu: gpu
	@for b in $(GPU_BENCHES); do $$b || exit 1; done

-include $(wildcard $(GPU_DIR)/obj/cuda/*.d $(GPU_DIR)/obj/tests/gpu/*.d)

# The GPU forward pass (runtime/gpu/gpu_*.c, glm5-run --device cuda, tests/gpu/test_gpu_model).
-include cuda/model.mk
