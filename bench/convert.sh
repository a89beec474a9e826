#!/usr/bin/env bash
# Converter wall time against `cat` of the same source into the same output directory, in the
# same run (issue 3: goal convert / cat <= 1.15).
#
#   bench/convert.sh                       # ~9 GB synthetic GLM-5 (1 MoE layer + NextN, 160 experts), T=8
#   EXPERTS=32 TP=2 bench/convert.sh       # a small smoke run
#   WORK=/fast/disk RECORD=1 bench/convert.sh   # append the result to bench/RESULTS.md
#
# Environment: BIN (glm5-shard), WORK (scratch dir, needs ~3x the model size free), LAYERS,
# EXPERTS, TP, EP=1 for --ep, JOBS, KEEP=1 to keep the synthetic model between runs,
# DROP_CACHES=1 (root) to drop the page cache before each timed step, RECORD=1.
#
# The converter fsyncs every file it writes; plain `cat` leaves its data dirty in the page cache.
# Both `cat` and `cat; sync` are timed and the ratio is reported against each; the fair one is
# against `cat + sync`. Both timed steps read the source from a warm page cache unless
# DROP_CACHES=1 (an untimed `cat > /dev/null` warms it first).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-build/bin/glm5-shard}
WORK=${WORK:-${TMPDIR:-/tmp}/glm5-bench}
LAYERS=${LAYERS:-1}
EXPERTS=${EXPERTS:-160}
TP=${TP:-8}
EP=${EP:-0}
JOBS=${JOBS:-$TP}
KEEP=${KEEP:-0}
DROP_CACHES=${DROP_CACHES:-0}
RECORD=${RECORD:-0}

[ -x "$BIN" ] || { echo "bench: $BIN not built (run make)" >&2; exit 2; }
mkdir -p "$WORK"
MODEL="$WORK/glm5-synth-l${LAYERS}-e${EXPERTS}.gguf"
OUT="$WORK/out"

now() { date +%s.%N; }
# Arithmetic through bc where installed, else awk (bare machines lack bc): reads "scale=N; expr".
if ! command -v bc >/dev/null 2>&1; then
  bc() {
    local e s=6
    e=$(cat)
    if [[ $e =~ ^scale=([0-9]+)\;(.*)$ ]]; then s=${BASH_REMATCH[1]}; e=${BASH_REMATCH[2]}; fi
    awk "BEGIN { printf \"%.${s}f\\n\", ($e) }"
  }
fi
drop() {
  if [ "$DROP_CACHES" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
}

if [ ! -f "$MODEL" ]; then
  echo "bench: synthesizing $MODEL (layers $LAYERS, experts $EXPERTS)"
  t0=$(now)
  "$BIN" synth --preset glm5 --layers "$LAYERS" --experts "$EXPERTS" -o "$MODEL"
  echo "bench: synth took $(echo "$(now) - $t0" | bc) s"
fi
SIZE=$(stat -c %s "$MODEL")
echo "bench: source $MODEL, $SIZE bytes ($(echo "scale=2; $SIZE / 1000000000" | bc) GB)"

rm -rf "$OUT"
mkdir -p "$OUT"
FREE=$(df --output=avail -B1 "$WORK" | tail -1)
if [ "$FREE" -lt $((SIZE * 25 / 10)) ]; then
  echo "bench: need about $((SIZE * 25 / 10)) bytes free in $WORK, have $FREE" >&2
  exit 2
fi

cat "$MODEL" > /dev/null   # warm the page cache (both timed steps then read from it)

drop
t0=$(now); cat "$MODEL" > "$OUT/x"; t1=$(now); sync; t2=$(now)
T_CAT=$(echo "$t1 - $t0" | bc)
T_CATSYNC=$(echo "$t2 - $t0" | bc)
rm -f "$OUT/x"
sync

EPFLAG=""
[ "$EP" = 1 ] && EPFLAG="--ep"
drop
t0=$(now)
"$BIN" convert --tp "$TP" $EPFLAG --jobs "$JOBS" --quiet --json -o "$OUT/blobs" "$MODEL" > "$WORK/convert.json"
t1=$(now)
T_CONV=$(echo "$t1 - $t0" | bc)
WRITTEN=$(du -sb "$OUT/blobs" | cut -f1)

R1=$(echo "scale=3; $T_CONV / $T_CAT" | bc)
R2=$(echo "scale=3; $T_CONV / $T_CATSYNC" | bc)
# Replicated tensors are written T times and kv_b grows to F32: the write amplification is a
# property of the plan (about 1.05 for the full GLM-5 at T = 8, far more for a 1-layer synthetic
# whose token_embd is a large share). Per written byte: (convert s / written) / (cat+sync s / source).
AMP=$(echo "scale=3; $WRITTEN / $SIZE" | bc)
RN=$(echo "scale=3; ($T_CONV * $SIZE) / ($WRITTEN * $T_CATSYNC)" | bc)
LINE="$(date -u +%Y-%m-%d) $(uname -n) $(nproc) cores: source $(echo "scale=2; $SIZE / 1000000000" | bc) GB, T=$TP${EPFLAG:+ ep} jobs $JOBS; cat ${T_CAT}s, cat+sync ${T_CATSYNC}s, convert ${T_CONV}s (wrote $(echo "scale=2; $WRITTEN / 1000000000" | bc) GB incl. fsync, amplification $AMP); ratio convert/cat $R1, convert/(cat+sync) $R2, per written byte vs cat+sync $RN"
echo "bench: $LINE"

T_VER0=$(now)
"$BIN" verify "$OUT/blobs" --jobs "$(nproc)" --quiet
echo "bench: verify $(echo "$(now) - $T_VER0" | bc) s"

if [ "$RECORD" = 1 ]; then
  echo "- $LINE" >> bench/RESULTS.md
fi
rm -rf "$OUT"
[ "$KEEP" = 1 ] || rm -f "$MODEL"
