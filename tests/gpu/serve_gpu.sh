#!/usr/bin/env bash
# glm5-serve --device cuda on the GPU machine, one call: build, then
#  (a) $B/gpu/tests/test_gpu_serve: rt_gpu_forward_batch against one rt_gpu_forward_seq call per
#      sequence on the oracle at TP 1 and TP 2 (bit-identical logits rows required), and the GPU
#      prefix cache (engine and in-process servers: reuse counts, bit-identical outputs);
#  (b) per configuration (TP 1 precise with --max-batch 16; TP 1 fast (bf16 cache) with
#      --max-batch 8, so half the requests queue and join the running batch later; TP 2 precise
#      on one device): glm5-run's greedy ids for 16 prompts of 4 .. 79 tokens (max_tokens 12 .. 42;
#      fast: with --products fp16, the products of a fast server batching),
#      then glm5-serve on the same blobs and 16 concurrent clients (test_gpu_serve --client)
#      whose ids must equal glm5-run's, twice, then a client that hangs up mid-stream; and TP 1
#      precise with --draft mtp for both programs (MTP speculative decoding: the server's greedy
#      ids must equal glm5-run's, its draft counters from /metrics are printed, and the client
#      time against tp1_precise's is the cost of drafting on the oracle's random MTP block), and
#      TP 1 fast with --draft mtp and --max-batch 8. The prefix cache is on in every server, so
#      the second pass of the clients attaches the first's cached prompt blocks (with --draft mtp
#      the drafters resume over them from the store's hidden states) and must give the same ids.
# Everything goes to $OUT (log, build.log, test_gpu_serve.log, serve_*.log, cases_*.tsv).
#
#   GLM5_SHARED=... OUT=... bash tests/gpu/serve_gpu.sh
#
# Like tests/gpu/run_device.sh it expects gpu-deps/ (scripts/gpu-deps.sh) and the oracle; B
# (default build/dev) is the build directory, SKIP_BUILD=1 reuses it as is. DEVICE=cpu runs part
# (b) with the same binaries on the CPU (a dry run of the script and the client without a GPU)
# and skips (a).
set -u
export G5_NO_DEPS=1  # no network or -dev packages on the GPU machine: no dependency probe
OUT=${OUT:-/tmp/g5serve}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
: "${GLM5_SHARED:=$PWD/oracle-carry}"
export GLM5_SHARED
CC=${CC:-$( [ -x /opt/gcc/bin/gcc ] && echo /opt/gcc/bin/gcc || echo gcc )}
B=${B:-build/dev}
DEVICE=${DEVICE:-cuda}
GGUF=$GLM5_SHARED/oracle/glm5-tiny/glm5-tiny-UD-Q4_K_XL.gguf
P1=(958 523 83 303 279 530 309 1624 578 1571 1040 299 350 387 71 25 277 640 488 304 384 713 643 468 11 277 1013 290 870 468 1316 65 496 840 11 277 1646 82 468 405 74 292 11 337 277 1117 1963 468 1713 439 817 292 337 1362 1342 13 1357 346 266 281 77 64 363 71 384 379 266 1351 1805 2012 1244 1326 599 277 288 1097 83 72 262 379 1294 2014 280 1035 85 352 986 1314 388 1841 1717 13)
W=/tmp/g5serve_work
rm -rf "$W" && mkdir -p "$W"

{
echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "commit ${COMMIT:-?}"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "== build"
  SECONDS=0
  make -k -j"$(nproc)" CC="$CC" BUILD=$B \
    EXTRA_CFLAGS="-isystem gpu-deps/include -Wno-error" EXTRA_LDFLAGS="-Lgpu-deps/lib" \
    gpu-model $B/bin/glm5-shard >"$OUT/build.log" 2>&1
  echo "build rc=$? in ${SECONDS}s"
  grep -E "warning|error" "$OUT/build.log" | grep -v "Werror\|Wno-error" | head -20
fi
ls -l $B/gpu/bin/glm5-serve $B/gpu/bin/glm5-run $B/gpu/tests/test_gpu_serve

if [ "$DEVICE" = cuda ]; then
  echo "== (a) batched vs one-at-a-time decoding (test_gpu_serve)"
  SECONDS=0
  $B/gpu/tests/test_gpu_serve >"$OUT/test_gpu_serve.log" 2>&1
  echo "test_gpu_serve rc=$? in ${SECONDS}s"
  grep -E "FAIL|rows over|differs|prefix store|: [0-9]+ passed" "$OUT/test_gpu_serve.log" | head -60
fi

echo "== (b) glm5-serve --device $DEVICE, 16 concurrent greedy clients against glm5-run"
$B/bin/glm5-shard convert --tp 1 --quiet -o $W/tp1 "$GGUF" && \
$B/bin/glm5-shard convert --tp 2 --quiet -o $W/tp2 "$GGUF"
echo "convert rc=$?"
run_config() { # name blobdir max_batch extra-flags...
  local name=$1 dir=$2 mb=$3
  shift 3
  local cases=$OUT/cases_$name.tsv run_extra=()
  # a fast server batching (--max-batch > 1) takes the fp16 products: glm5-run's references too
  case " $* " in *" --precision fast "*) [ "$mb" -gt 1 ] && [ "$DEVICE" = cuda ] && run_extra=(--products fp16) ;; esac
  : >"$cases"
  SECONDS=0
  for i in $(seq 0 15); do
    local len=$((4 + 5 * i)) n=$((12 + 2 * i)) ids=""
    for k in $(seq 0 $((len - 1))); do ids="$ids${ids:+,}${P1[$(((3 * i + k) % ${#P1[@]}))]}"; done
    local out
    out=$($B/gpu/bin/glm5-run -m "$dir" --device $DEVICE --tokens "$ids" -n $n --temp 0 --ids -q "$@" "${run_extra[@]}" 2>>"$OUT/glm5run_$name.err")
    local rc=$?
    [ $rc = 0 ] || echo "glm5-run case $i rc=$rc (see $OUT/glm5run_$name.err)"
    printf '%s\t%s\t%s\n' "$n" "$ids" "$out" >>"$cases"
  done
  echo "-- $name: 16 glm5-run references in ${SECONDS}s"
  local log=$OUT/serve_$name.log
  $B/gpu/bin/glm5-serve -m "$dir" --device $DEVICE --port 0 --max-batch "$mb" --ctx-size 512 "$@" 2>"$log" &
  local pid=$! port=""
  for k in $(seq 1 300); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "$name: glm5-serve did not start"; cat "$log"; kill $pid 2>/dev/null; wait $pid 2>/dev/null; return
  fi
  SECONDS=0
  $B/gpu/tests/test_gpu_serve --client "$port" "$cases"
  echo "$name: client rc=$? in ${SECONDS}s"
  if exec 3<>/dev/tcp/127.0.0.1/"$port"; then # the draft counters (0 without --draft mtp)
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
    grep -E '^glm5_(draft|generation_tokens)' <&3 | tr '\n' ' '
    echo
    exec 3<&-
  fi
  kill -TERM $pid
  wait $pid
  echo "$name: glm5-serve rc=$? after SIGTERM"
  grep -E "model loaded|GPU |prefix cache|failed|error" "$log" | head -6
}
run_config tp1_precise $W/tp1 16
run_config tp1_fast $W/tp1 8 --precision fast
run_config tp2_precise $W/tp2 16
run_config tp1_precise_draft $W/tp1 16 --draft mtp
run_config tp1_fast_draft $W/tp1 8 --precision fast --draft mtp
} 2>&1 | tee "$OUT/log"
