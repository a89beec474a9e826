#!/usr/bin/env bash
# Device work for the fp16 products (bench/RESULTS.md and NOTES.md, sessions 40 and 41).
#   bash bench/pending/s41-next.sh build   # here: the cuda objects h16bench links, then .dev/h16bench
#   device call A, carry [".dev"] alone (the binary is ~38 MB): bash bench/pending/s41-next.sh bench
#     h16bench: cuk_gemv_h16 at 1 vector against dp4a xs, at 8 and 32 against q8t, every column
#     equal to its one-vector launch
#   bash bench/pending/s41-next.sh here    # applies s41-h16-wire.patch, prepares head=HEAD (ab.sh)
#   device call B, carry gpu-deps, oracle-carry, .dev (rm .dev/h16bench first: the carry limit):
#     bash bench/pending/s41-next.sh test  # make test-gpu on the wired tree (test_gemv_h16 among
#                                          # them), peer rounds at 1 / 8 / 32 against HEAD
# Session 41 ran both (bench/RESULTS.md, session 41): the wiring is not landed (one token +0.29 ms,
# batch 32 -2.3 ms; oracle_cli fast/f16's NextN bar 9.12e-2 > 0.09). bench/NOTES.md, session 41,
# lists the ways on; each reuses `here` + `test` with its own patch. `serve` (not run yet: no machine
# came) measures glm5-serve with the wiring applied.
set -u
cd "$(dirname "$0")/../.." || exit 2
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
here)
  git apply bench/pending/s41-h16-wire.patch || { echo "s41-h16-wire.patch does not apply" >&2; exit 2; }
  bash bench/ab.sh prepare head=HEAD || exit 2
  ;;
test)
  TESTGPU=1 ROUNDS=2 LIMIT=60 PEER="--pp 512 --depth 512 --tg 16 --batch 1,8,32 --reps 1" \
    bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  echo "ab.sh rc=$?"
  grep -E "make test-gpu|build rc|side builds" "$OUT/ab.log" | head
  grep -E "FAIL|test_gemv_h16|fast" "$OUT/test-gpu.log" | head -30
  python3 bench/ab_table.py "$OUT/ab.log" head
  ;;
serve)
  # on the device, after `git apply bench/pending/s41-h16-wire.patch` here (carry gpu-deps alone):
  # glm5-serve with the wiring at 1 / 8 / 32 clients (HEAD's: 318.5 / 781.3 / 1248.8 tok/s, session 39)
  W=$PWD/build/g5peer SKIP_BUILD=0 CENTRED=1 PRECISIONS=fast timeout 370 bash bench/serve.sh >"$OUT/serve_out.log" 2>&1
  echo "serve.sh rc=$?"
  tail -40 "$OUT/serve_out.log"
  ;;
*) echo "usage: $0 build|bench|here|test|serve" >&2; exit 2 ;;
esac
