# The GPU forward pass, included by cuda/cuda.mk (never part of `all`/`test`: CI has no GPU).
#   make gpu        also builds $(GPU_DIR)/bin/glm5-run (glm5-run with --device cuda)
#   make test-gpu   also runs tests/gpu/test_gpu_model (kernels of cuda/cuk_model.h, the loader,
#                   the oracle in precise mode); it needs $GLM5_SHARED like the CPU tests.
#
# runtime/gpu/gpu_*.c hold the GPU runtime; the CPU build compiles them to nothing, here they get
# G5_WITH_CUDA. Programs are linked by $(CC) with the static CUDA runtime, and xxhash, zstd,
# pcre2 and jansson linked statically: the GPU machines lack those runtime packages. NCCL is
# loaded at run time (dlopen) and only for ranks on several devices; its header comes from the
# CUDA toolkit when present (else the build has no NCCL path: G5_HAVE_NCCL stays undefined).
# MPI_LIBS (Makefile) is empty where MPI is absent; where present the runtime archive's comm.o
# needs it.

GPU_RT_SRC      := $(wildcard runtime/gpu/gpu_*.c) runtime/engine_gpu.c
GPU_RT_OBJ      := $(patsubst %.c,$(GPU_DIR)/obj/%.o,$(GPU_RT_SRC))
GPU_CFLAGS       = $(CFLAGS) -DG5_WITH_CUDA -isystem $(CUDA_HOME)/include
GPU_STATIC_LIBS := -Wl,-Bstatic -ljansson -lpcre2-8 -lzstd -lxxhash -Wl,-Bdynamic
# cuBLAS (the prefill GEMM path, cuda/gemm.cu) is linked dynamically (CUBLAS_LINK, cuda.mk): the
# toolkit here ships no static one, and the GPU machines have libcublas.so.13 in the system path.
GPU_SYS_LIBS    := -L$(CUDA_HOME)/lib64 $(CUBLAS_LINK) -lcudart_static -lstdc++ -ldl -lrt -lm -lpthread
GPU_MODEL_TEST  := $(GPU_DIR)/tests/test_gpu_model
GPU_MODEL_TEST_SRC := $(firstword $(wildcard tests/gpu/test_gpu_model.c tests/gpu/test_gpu_model.c.wip))

.PHONY: gpu-model
gpu: $(GPU_DIR)/bin/glm5-run
gpu-model: $(GPU_DIR)/bin/glm5-run $(GPU_MODEL_TEST)

$(GPU_DIR)/obj/runtime/%.o: runtime/%.c
	@mkdir -p $(dir $@)
	$(CC) $(GPU_CFLAGS) -c $< -o $@

$(GPU_DIR)/bin/glm5-run: $(GPU_DIR)/obj/runtime/cli/main_run.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

# glm5-serve --device cuda: the engine's CUDA implementation (runtime/engine_gpu.c, in GPU_RT_OBJ)
# and serve_notls.c (GnuTLS stubs for the static libmicrohttpd, which the GPU machine has no
# GnuTLS for) built with G5_WITH_CUDA ahead of the CPU archive; tests/gpu/test_gpu_serve checks batched against one-at-a-time decoding and
# the GPU prefix cache (engine and an in-process server, so it links like glm5-serve), and is the
# concurrent client of tests/gpu/serve_gpu.sh.
GPU_SERVE_OBJ  := $(GPU_DIR)/obj/runtime/serve/serve_notls.o
GPU_SERVE_TEST := $(GPU_DIR)/tests/test_gpu_serve
gpu: $(GPU_DIR)/bin/glm5-serve
gpu-model: $(GPU_DIR)/bin/glm5-serve $(GPU_SERVE_TEST)

$(GPU_DIR)/bin/glm5-serve: $(GPU_DIR)/obj/runtime/cli/main_serve.o $(GPU_SERVE_OBJ) $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -Wl,-Bstatic -lmicrohttpd -Wl,-Bdynamic $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

$(GPU_SERVE_TEST): $(GPU_DIR)/obj/tests/gpu/test_gpu_serve.o $(GPU_SERVE_OBJ) $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -Wl,-Bstatic -lmicrohttpd -Wl,-Bdynamic $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

$(GPU_DIR)/obj/tests/gpu/test_gpu_model.o: $(GPU_MODEL_TEST_SRC)
	@mkdir -p $(dir $@)
	$(CC) $(GPU_CFLAGS) -x c -c $< -o $@

$(GPU_MODEL_TEST): $(GPU_DIR)/obj/tests/gpu/test_gpu_model.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

# tests/gpu/test_gpu_graph: the decode step as a CUDA graph (runtime/gpu/gpu_graph.c) against plain
# launches on the oracle; linked like test_gpu_model (it needs the whole runtime).
GPU_GRAPH_TEST := $(GPU_DIR)/tests/test_gpu_graph
gpu-model: $(GPU_GRAPH_TEST)
$(GPU_GRAPH_TEST): $(GPU_DIR)/obj/tests/gpu/test_gpu_graph.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

# tests/gpu/test_gpu_glm52: GLM-5.2 (IndexShare) in precise mode against transformers
# (tests/data/glm52-tiny); linked like test_gpu_model (it needs the whole runtime).
GPU_GLM52_TEST := $(GPU_DIR)/tests/test_gpu_glm52
gpu-model: $(GPU_GLM52_TEST)
$(GPU_GLM52_TEST): $(GPU_DIR)/obj/tests/gpu/test_gpu_glm52.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

# tests/gpu/test_gpu_mtp: the NextN/MTP block on the GPU (runtime/gpu/gpu_mtp.c) against
# rt_model_mtp on the oracle; linked like test_gpu_model (it needs the whole runtime).
GPU_MTP_TEST := $(GPU_DIR)/tests/test_gpu_mtp
gpu-model: $(GPU_MTP_TEST)
$(GPU_MTP_TEST): $(GPU_DIR)/obj/tests/gpu/test_gpu_mtp.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

# tests/gpu/test_gpu_types: every weight type in every role (synth's type presets) against the CPU;
# linked like test_gpu_model (it needs the whole runtime and convert/'s synth).
GPU_TYPES_TEST := $(GPU_DIR)/tests/test_gpu_types
gpu-model: $(GPU_TYPES_TEST)
$(GPU_TYPES_TEST): $(GPU_DIR)/obj/tests/gpu/test_gpu_types.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

# tests/gpu/test_gpu_comm: the GPU model and the processes of a launch (runtime/gpu/gpu_coll.c); one
# process on the device, or `mpirun -np P` of it on a build with MPI (no GPU needed there).
GPU_COMM_TEST := $(GPU_DIR)/tests/test_gpu_comm
gpu-model: $(GPU_COMM_TEST)
$(GPU_COMM_TEST): $(GPU_DIR)/obj/tests/gpu/test_gpu_comm.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

-include $(wildcard $(GPU_DIR)/obj/runtime/*.d $(GPU_DIR)/obj/runtime/*/*.d)

# tests/gpu/bench_load (bench/load.sh): the blob loader against read and H2D ceilings. Linked
# like glm5-run (it needs runtime/gpu/gpu_load.c and format/), not through the generic bench rule.
GPU_LOAD_BENCH := $(GPU_DIR)/tests/bench_load
$(GPU_LOAD_BENCH): $(GPU_DIR)/obj/tests/gpu/bench_load.o $(GPU_DIR)/obj/runtime/gpu/gpu_load.o $(LIB_FORMAT)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

# tests/gpu/bench_decode (bench/decode.sh, bench/prefill.sh): a GLM-5 TP8 rank's decode and
# prefill, built in memory from synthetic data (it needs the whole runtime, convert/'s synth and
# shard plan, and cuBLAS for its ceilings). Linked like glm5-run, not through the generic rule.
GPU_DECODE_BENCH := $(GPU_DIR)/tests/bench_decode
gpu-model: $(GPU_DECODE_BENCH)
$(GPU_DIR)/obj/tests/gpu/bench_decode.o: tests/gpu/bench_decode.c
	@mkdir -p $(dir $@)
	$(CC) $(GPU_CFLAGS) -c $< -o $@
$(GPU_DECODE_BENCH): $(GPU_DIR)/obj/tests/gpu/bench_decode.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@

# tests/gpu/bench_peer (bench/peer.sh): a whole model from a blob set, measured as llama-bench
# measures llama.cpp (pp N, tg M at depth d, batched decode). Linked like glm5-run.
GPU_PEER_BENCH := $(GPU_DIR)/tests/bench_peer
gpu-model: $(GPU_PEER_BENCH)
$(GPU_DIR)/obj/tests/gpu/bench_peer.o: tests/gpu/bench_peer.c
	@mkdir -p $(dir $@)
	$(CC) $(GPU_CFLAGS) -c $< -o $@
$(GPU_PEER_BENCH): $(GPU_DIR)/obj/tests/gpu/bench_peer.o $(GPU_RT_OBJ) $(LIBS) $(GPU_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(GPU_STATIC_LIBS) $(MPI_LIBS) $(GPU_SYS_LIBS) -o $@
