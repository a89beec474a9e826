#!/usr/bin/env bash
# The peer benchmark, in one device call: the model llama.cpp was measured on (`glm5-shard synth
# --preset glm5 --layers 12 --experts 64`, 17.35 GiB, UD-Q4_K_XL-like mix), converted at TP 1,
# run by tests/gpu/bench_peer (llama-bench's pp512 / pp4096, tg64 at depth 512 / 4096 / 16384,
# and batched decode at 1 / 8 / 32 sequences) in fast and precise mode. llama.cpp's figures on the
# same file and GPU (llama-bench -ngl 99 -fa on, unslothai/llama.cpp d32676d7): pp512 8042,
# pp4096 7053; tg after 512 / 4096 / 16384 tokens 229.5 / 213.2 / 173.5 tok/s.
#
#   OUT=/tmp/out bash bench/peer.sh        # on the GPU machine (logs: $OUT/peer.log)
#
# Environment: as bench/decode.sh (B, CC, DEPS, SKIP_BUILD), plus W (work folder on the device's
# disk, default /tmp/g5peer), PRECISIONS (default "fast precise"), ARGS (more bench_peer options),
# LAYERS / EXPERTS (default 12 / 64), LIMIT (seconds per bench_peer run, default 300), LONG (a
# long-prompt size run after the fast precision's table in calls of CHUNK tokens, as glm5-run
# --prefill-chunk does; default 32768 in calls of 4096; LONG=0 skips it), CENTRED (set: the same
# shapes and types from `synth --centred`, zero-mean weights like trained ones, in files of their
# own; not the file llama.cpp was measured on).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/g5peer-out}
W=${W:-/tmp/g5peer}
mkdir -p "$OUT" "$W"
source bench/common.sh
SECONDS=0
{
bench_header
bench_build "$OUT/build_peer.log" "$B/bin/glm5-shard" "$B/gpu/tests/bench_peer" || exit 3
bench_peer_model || exit 3
rc=0
for p in ${PRECISIONS:-fast precise}; do
  echo "== bench_peer --precision $p"
  timeout "${LIMIT:-300}" "$B/gpu/tests/bench_peer" -m "$blobs" --precision "$p" ${ARGS:-} || rc=1
done
if [ "${LONG:-32768}" != 0 ]; then
  echo "== bench_peer --precision fast --pp ${LONG:-32768} --chunk ${CHUNK:-4096}"
  timeout "${LIMIT:-300}" "$B/gpu/tests/bench_peer" -m "$blobs" --precision fast --pp "${LONG:-32768}" \
    --chunk "${CHUNK:-4096}" --depth 512 --batch 1 --tg 8 --reps 1 --no-verify || rc=1
fi
echo "peer.sh rc=$rc total ${SECONDS}s"
} 2>&1 | tee "$OUT/peer.log"
