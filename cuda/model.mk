# The GPU forward pass, included by cuda/cuda.mk (never part of `all`/`test`: CI has no GPU).
#   make gpu        also builds $(GPU_DIR)/bin/glm5-run (glm5-run with --device cuda)
#   make test-gpu   also runs tests/gpu/test_gpu_model (kernels of cuda/cuk_model.h, the loader,
#                   the oracle in precise mode); it needs $GLM5_SHARED like the CPU tests.
#
# runtime/gpu_*.c hold the GPU runtime; the CPU build compiles them to nothing, here they get
# G5_WITH_CUDA. Programs are linked by $(CC) with the static CUDA runtime, and xxhash, zstd,
# pcre2 and jansson linked statically: the GPU machines lack those runtime packages. NCCL is
# loaded at run time (dlopen) and only for ranks on several devices; its header comes from the
# CUDA toolkit when present (else the build has no NCCL path: G5_HAVE_NCCL stays undefined).

GPU_RT_SRC      := $(wildcard runtime/gpu_*.c)
GPU_RT_OBJ      := $(patsubst %.c,$(GPU_DIR)/obj/%.o,$(GPU_RT_SRC))
GPU_CFLAGS       = $(CFLAGS) -DG5_WITH_CUDA -isystem $(CUDA_HOME)/include
GPU_STATIC_LIBS := -Wl,-Bstatic -ljansson -lpcre2-8 -lzstd -lxxhash -Wl,-Bdynamic
GPU_SYS_LIBS    := -L$(CUDA_HOME)/lib64 -lcudart_static -lstdc++ -ldl -lrt -lm -lpthread
GPU_MODEL_TEST  := $(GPU_DIR)/tests/test_gpu_model
GPU_MODEL_TEST_SRC := $(firstword $(wildcard tests/gpu/test_gpu_model.c tests/gpu/test_gpu_model.c.wip))

.PHONY: gpu-model
gpu: $(GPU_DIR)/bin/glm5-run
gpu-model: $(GPU_DIR)/bin/glm5-run $(GPU_MODEL_TEST)

$(GPU_DIR)/obj/runtime/%.o: runtime/%.c
	@mkdir -p $(dir $@)
	$(CC) $(GPU_CFLAGS) -c $< -o $@

$(GPU_DIR)/bin/glm5-run: $(GPU_DIR)/obj/runtime/main_run.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(GPU_SYS_LIBS) -o $@

$(GPU_DIR)/obj/tests/gpu/test_gpu_model.o: $(GPU_MODEL_TEST_SRC)
	@mkdir -p $(dir $@)
	$(CC) $(GPU_CFLAGS) -x c -c $< -o $@

$(GPU_MODEL_TEST): $(GPU_DIR)/obj/tests/gpu/test_gpu_model.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(GPU_SYS_LIBS) -o $@

-include $(wildcard $(GPU_DIR)/obj/runtime/*.d)

# tests/gpu/bench_load (bench/load.sh): the blob loader against read and H2D ceilings. Linked
# like glm5-run (it needs runtime/gpu_load.c and format/), not through the generic bench rule.
GPU_LOAD_BENCH := $(GPU_DIR)/tests/bench_load
$(GPU_LOAD_BENCH): $(GPU_DIR)/obj/tests/gpu/bench_load.o $(GPU_DIR)/obj/runtime/gpu_load.o $(LIB_FORMAT)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(GPU_SYS_LIBS) -o $@
