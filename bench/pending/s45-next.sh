#!/usr/bin/env bash
# Device work prepared in session 45 (bench/NOTES.md, session 45), each one call:
#   bash bench/pending/s45-next.sh h200    # on an H200 (carry gpu-deps): the issue's figures, none
#                                          # since session 23: bench_peer (pp512 / pp4096, tg64 at
#                                          # 512 / 4096 / 16384 / 32768, batch 1 / 8 / 32)
#   bash bench/pending/s45-next.sh serve   # then, the machine warm: serve.sh (fast, VERIFY=1:
#                                          # glm5-serve's fp16 products)
#   bash bench/pending/s45-next.sh build   # here: the cuda objects h16bench links, then .dev/h16bench
#   bash bench/pending/s45-next.sh bench   # carry [".dev"] alone (~38 MB): h16bench (cuk_gemv_h16
#                                          # against the int8 forms and h16x at 1 / 8 / 32 vectors;
#                                          # a variant of the kernel goes in before `build`)
#   bash bench/pending/s45-next.sh profile # carry gpu-deps: bench_peer --h16 --profile: the class table of
#                                          # a 256-token prefill call (the server's), one token and a
#                                          # batch-32 step with glm5-serve's fp16 products
#   bash bench/pending/s45-next.sh test    # carry gpu-deps and oracle-carry: make test-gpu
#                                          # (tests/gpu/run_device.sh, no converter bench)
#   bash bench/pending/s45-next.sh moebench # carry gpu-deps and .dev/mv: bench_moe_mm (R 16 / 32 / 64,
#                                          # gate+up and down timed apart) on the tree, then with each
#                                          # .dev/mv/NAME/moe_mm.cu in place of cuda/moe_mm.cu, each
#                                          # with test_moe_mm; NCU_R="16 64": ncu --set full of the
#                                          # tree's k_moe_mm at those R. The binaries left in build/
#                                          # are the last variant's: bench_build again before reuse
#   bash bench/pending/s45-next.sh ncumoe  # carry gpu-deps: ncu of k_moe_mm in a 256-token fast
#                                          # prefill call (--set full, first two launches: one
#                                          # layer's gate+up and down), then every kernel's time
#                                          # and grid in one such call (durations.csv)
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
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  PRECISIONS=fast LONG=0 LIMIT=300 ARGS="--pp 512,4096 --depth 512,4096,16384,32768 --batch 1,8,32 --reps 1 --tg 64" \
    timeout 560 bash bench/peer.sh >"$OUT/peer_out.log" 2>&1
  echo "peer.sh rc=$?"
  grep -E "build rc|synth|convert|pp[0-9]+ |tg64 @|batch [0-9]+ @|floor|copy|total" "$OUT/peer_out.log" | head -40
  ;;
serve)
  PRECISIONS=fast VERIFY=1 timeout 400 bash bench/serve.sh >"$OUT/serve_out.log" 2>&1
  echo "serve.sh rc=$?"
  tail -25 "$OUT/serve_out.log"
  ;;
profile)
  bench_build "$OUT/build.log" $B/bin/glm5-shard $T/bench_peer || exit 3
  bench_peer_model || exit 3
  timeout 240 "$T/bench_peer" -m "$blobs" --precision fast --h16 --pp 512,256 --depth 512 --tg 8 --batch 32 \
    --reps 3 --profile >"$OUT/profile.log" 2>&1
  echo "bench_peer rc=$?"
  grep -E "^pp|^tg|^batch|class|^\| (attention|indexer|dense|routed|lm_head|other|total)" "$OUT/profile.log" | head -40
  ;;
moebench)
  # the tree's copy and the build logs stay out of $OUT: a call brings back only a few files
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  M=$B/gpu/tests/bench_moe_mm
  cp cuda/moe_mm.cu /tmp/moe_mm.tree.cu
  touch cuda/moe_mm.cu # a warm machine's objects may be a variant's, newer than the tree's copy
  for v in tree $(ls .dev/mv 2>/dev/null); do
    [ "$v" = tree ] || cp ".dev/mv/$v/moe_mm.cu" cuda/moe_mm.cu
    bench_build "/tmp/build_$v.log" "$M" || { cp /tmp/moe_mm.tree.cu cuda/moe_mm.cu; continue; }
    echo "== $v"
    for rep in 1 2; do timeout 120 "$M" 16,32,64 --fused-only | grep "fused gate"; done
    if bench_build "/tmp/buildt_$v.log" $B/gpu/tests/test_moe_mm; then
      timeout 120 $B/gpu/tests/test_moe_mm >"$OUT/test_$v.log" 2>&1; echo "test_moe_mm ($v) rc=$?: $(tail -1 "$OUT/test_$v.log")"
    fi
    if [ "$v" = tree ]; then
      for R in ${NCU_R:-}; do
        timeout 150 /usr/local/cuda/bin/ncu -k regex:'^k_moe_mm$' --launch-count 2 --set full "$M" $R --fused-only \
          >"$OUT/ncu_R$R.txt" 2>&1
        echo "ncu R=$R rc=$?"
        grep -E "k_moe_mm|Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy" \
          "$OUT/ncu_R$R.txt" | head -20
      done
    fi
    cp /tmp/moe_mm.tree.cu cuda/moe_mm.cu
  done
  ;;
ncumoe)
  bench_build "$OUT/build.log" $B/bin/glm5-shard $T/bench_peer || exit 3
  bench_peer_model || exit 3
  NCU=/usr/local/cuda/bin/ncu
  args=(-m "$blobs" --precision fast --h16 --no-verify --pp 256 --depth 8 --tg 1 --batch 1 --reps 1)
  timeout 200 $NCU -k regex:'^k_moe_mm$' --launch-count 2 --set full -o "$OUT/moe_mm" "$T/bench_peer" "${args[@]}" \
    >"$OUT/ncu1.log" 2>&1
  echo "ncu set full rc=$?"
  $NCU -i "$OUT/moe_mm.ncu-rep" --page details >"$OUT/moe_mm_details.txt" 2>&1
  grep -E "Duration|Grid Size|Registers|Achieved Occupancy|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy" \
    "$OUT/moe_mm_details.txt" | head -24
  timeout 240 $NCU --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size --csv --page raw \
    "$T/bench_peer" "${args[@]}" >"$OUT/durations.csv" 2>"$OUT/ncu2.log"
  echo "ncu durations rc=$? ($(wc -l <"$OUT/durations.csv") lines)"
  ;;
test)
  GLM5_SHARED=$PWD/oracle-carry CONVERT_BENCH=0 timeout 580 bash tests/gpu/run_device.sh >"$OUT/rd.log" 2>&1
  echo "run_device rc=$?"
  grep -E "build rc|passed|FAIL" "$OUT/rd.log" | tail -30
  ;;
*) echo "usage: $0 build|bench|h200|serve|profile|moebench|ncumoe|test" >&2; exit 2 ;;
esac
