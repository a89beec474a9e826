#!/usr/bin/env bash
# Blob -> GPU load rate at GLM-5 scale, in one device call (issue 6, benchmark 1): build
# glm5-shard and tests/gpu/bench_load, synthesize a GLM-5-shaped GGUF sized to the disk, convert
# it at TP 8, then load the rank blobs one at a time with the GPU loader (runtime/gpu/gpu_load.h),
# warm (page cache) and cold (caches dropped before each measurement; needs root), checksums on
# and off, against ceilings measured in the same run: pinned H2D and a parallel read of the same
# file with the same threads. Ratio = load GB/s / min(H2D, read); goal >= 0.90 with checksums,
# steady state (a loader made beforehand) and e2e (rt_gpu_load_blob over every rank, pinning the
# ring included). The table (stdout of bench_load) is at the end of the log.
#
#   OUT=/tmp/out bash bench/load.sh            # on the GPU machine (tee'd log: $OUT/load.log)
#
# Environment: B (build dir, default build/dev), CC (default /opt/gcc/bin/gcc when present),
# DEPS (static xxhash/zstd/pcre2/jansson/microhttpd, default gpu-deps), WORK (scratch, default
# /tmp/g5load), LAYERS (synth --layers; default 5 = 3 MoE layers + NextN, stepped down to fit
# the disk), TP (8), THREADS ("4,8,16": warm), COLD_THREADS ("4,16"), WARM_RANKS (3: ranks
# measured per thread count; the e2e rows use every rank), COLD_RANKS (2), LIMIT (seconds for
# the whole script, default 225: rows past the budget are skipped), SKIP_BUILD=1, KEEP=1 (keep the blobs),
# EXPERTS (synth --experts, for smoke runs), BENCH_ARGS (more bench_load options, e.g. --no-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/g5load-out}
mkdir -p "$OUT"
source bench/common.sh
WORK=${WORK:-/tmp/g5load}
LAYERS=${LAYERS:-5}
TP=${TP:-8}
THREADS=${THREADS:-4,8,16}
COLD_THREADS=${COLD_THREADS:-4,16}
COLD_RANKS=${COLD_RANKS:-2}
WARM_RANKS=${WARM_RANKS:-3}
LIMIT=${LIMIT:-225}
XP=${EXPERTS:+--experts $EXPERTS}
SECONDS=0

{
bench_header
df -h "$(dirname "$WORK")" | tail -1

bench_build "$OUT/build.log" "$B/bin/glm5-shard" "$B/gpu/tests/bench_load" || exit 3
BIN=$B/bin/glm5-shard

rm -rf "$WORK" && mkdir -p "$WORK"
FREE=$(df --output=avail -B1 "$WORK" | tail -1)
# Source + blobs (replicated tensors, kv_b in F32: about 1.1-1.4 x the source at TP 8) + slack.
for L in $LAYERS 4 1; do
  S=$($BIN synth --preset glm5 --layers "$L" $XP --dry-run -o "$WORK/m.gguf" | tail -1 | sed -E 's/.* tensors, ([0-9]+) bytes.*/\1/')
  [ $((S * 25 / 10 + 2000000000)) -lt "$FREE" ] && break
done
LAYERS=$L
echo "== synth --preset glm5 --layers $LAYERS: $((S / 1000000)) MB of tensor data ($((FREE / 1000000000)) GB free)"
t0=$SECONDS
$BIN synth --preset glm5 --layers "$LAYERS" $XP -o "$WORK/m.gguf" || exit 3
echo "synth ${SECONDS}s total ($((SECONDS - t0)) s)"
t0=$SECONDS
$BIN convert --tp "$TP" --jobs "$TP" --quiet -o "$WORK/blobs" "$WORK/m.gguf" || exit 3
echo "convert TP=$TP: $((SECONDS - t0)) s; rank blobs:"
rm -f "$WORK/m.gguf"   # frees the disk and the page cache it held
ls -l "$WORK/blobs"/rank-*.g5b | awk '{printf "  %s %.2f GB\n", $NF, $5 / 1e9}'

echo "== load (bench_load; budget $((LIMIT - SECONDS - 15)) s)"
"$B/gpu/tests/bench_load" --threads "$THREADS" --cold-threads "$COLD_THREADS" --cold-ranks "$COLD_RANKS" \
  --warm-ranks "$WARM_RANKS" ${BENCH_ARGS:-} \
  --budget $((LIMIT - SECONDS - 15)) "$WORK/blobs"/rank-*.g5b 2>"$OUT/bench_load.detail.log"
rc=$?
echo "bench_load rc=$rc; per-measurement lines:"
cat "$OUT/bench_load.detail.log"
[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
echo "load.sh total ${SECONDS}s"
} 2>&1 | tee "$OUT/load.log"
