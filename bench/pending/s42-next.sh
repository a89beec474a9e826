#!/usr/bin/env bash
# Device work prepared in session 42 (bench/NOTES.md, session 42), each one call:
#   bash bench/pending/s42-next.sh h200    # on an H200 (carry gpu-deps): the issue's figures, none
#                                          # since session 23: bench_peer (pp512 / pp4096, tg64 at
#                                          # 512 / 4096 / 16384 / 32768, batch 1 / 8 / 32), then
#                                          # serve.sh (fast, VERIFY=1: glm5-serve's fp16 products)
#   bash bench/pending/s42-next.sh build   # here: the cuda objects h16bench links, then .dev/h16bench
#   bash bench/pending/s42-next.sh bench   # carry [".dev"] alone (~38 MB): h16bench (cuk_gemv_h16
#                                          # against the int8 forms at 1 / 8 / 32 vectors)
#   bash bench/pending/s42-next.sh test    # carry gpu-deps and oracle-carry: the GPU tests of the
#                                          # fp16 products (test_gemv_h16, test_moe_mm and the
#                                          # fp16-products rows of test_gpu_model / _serve / _graph),
#                                          # then bench_peer with and without --h16, alternated
set -u
cd "$(dirname "$0")/../.." || exit 2
export CENTRED=1 W=$PWD/build/g5peer
source bench/common.sh
T=$B/gpu/tests
mkdir -p "$W"
case "${1:-}" in
build)
  O=build/gpu/obj/cuda
  make -j"$(nproc)" CUDA_ARCH=90 G5_NO_DEPS=1 $O/device.o $O/gemv_q8t.o $O/gemv_q8.o $O/gemv_q8_lba.o \
    $O/gemv_q8_lbb.o $O/gemv_q8_lbc.o $O/moe_plan.o || exit 2
  mkdir -p .dev/fmt
  for f in status quant quant_lowbit; do
    gcc -std=c11 -D_GNU_SOURCE -O2 -ffp-contract=off -I. -c format/$f.c -o .dev/fmt/$f.o || exit 2
  done
  nvcc -std=c++17 -O3 -arch=sm_90 -I. -Xcompiler -Wall,-Wextra,-ffp-contract=off -Werror all-warnings -cudart static \
    -o .dev/h16bench bench/pending/h16bench.cu $O/device.o $O/gemv_q8t.o $O/gemv_q8.o $O/gemv_q8_lba.o \
    $O/gemv_q8_lbb.o $O/gemv_q8_lbc.o $O/moe_plan.o .dev/fmt/*.o || exit 2
  rm -rf .dev/fmt
  ls -la .dev/h16bench
  ;;
bench)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  timeout 300 .dev/h16bench 30
  echo "h16bench rc=$?"
  ;;
h200)
  PRECISIONS=fast LONG=0 LIMIT=240 ARGS="--pp 512,4096 --depth 512,4096,16384,32768 --batch 1,8,32 --reps 1 --tg 64" \
    bash bench/peer.sh >"$OUT/peer_out.log" 2>&1
  echo "peer.sh rc=$?"
  grep -E "build rc|synth|convert|pp[0-9]+ |tg64 @|batch [0-9]+ @|floor|copy" "$OUT/peer_out.log" | head -40
  PRECISIONS=fast VERIFY=1 timeout 240 bash bench/serve.sh >"$OUT/serve_out.log" 2>&1
  echo "serve.sh rc=$?"
  tail -25 "$OUT/serve_out.log"
  ;;
test)
  export GLM5_SHARED=$PWD/oracle-carry
  bench_build "$OUT/build.log" $B/bin/glm5-shard $T/bench_peer $T/test_gemv_h16 $T/test_moe_mm $T/test_gpu_model \
    $T/test_gpu_serve $T/test_gpu_graph || exit 3
  (bench_peer_model >"$OUT/model.log" 2>&1) &
  for t in test_gemv_h16 test_moe_mm test_gpu_graph test_gpu_serve test_gpu_model; do
    (timeout 300 "$T/$t" >"$OUT/$t.log" 2>&1; echo "$t rc=$?: $(tail -1 "$OUT/$t.log")") &
  done
  wait
  grep -E "FAIL" "$OUT"/test_*.log | head -20
  grep -hE "fp16 products" "$OUT"/test_gpu_*.log | head -20
  cat "$OUT/model.log"
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in int8 h16; do
      timeout 200 "$T/bench_peer" -m "$W/tp1-centred" --precision fast --pp 512 --depth 512 --tg 16 \
        --batch 1,8,32 --reps 1 $([ $v = h16 ] && echo --h16) >"$OUT/peer_${v}_$r.log" 2>&1
      echo "round $r $v: $(grep -oE '(tg[0-9]+|batch [0-9]+) @ [0-9]+ fast: [0-9.]+ tok/s( aggregate)? \([0-9.]+ ms' \
        "$OUT/peer_${v}_$r.log" | sed 's/ fast//; s/ tok\/s aggregate (/ tok\/s, /; s/ tok\/s (/ tok\/s, /' | tr '\n' ';')"
    done
  done | tee "$OUT/rounds.log"
  python3 bench/ab_table.py "$OUT/rounds.log" int8
  ;;
*) echo "usage: $0 build|bench|h200|test" >&2; exit 2 ;;
esac
