#!/usr/bin/env bash
# glm5-serve --device cuda under concurrent clients, in one device call: the peer model of
# bench/peer.sh (`glm5-shard synth --preset glm5 --layers 12 --experts 64`, TP 1), glm5-serve with
# --max-batch 32 --ctx-size 1024, then bench/serve_load.py: 1, 8 and 32 concurrent greedy clients,
# each a streamed completion of a 512-token prompt (random ids) for 128 tokens; per run the
# aggregate tokens/s and the time to first token. Once for each precision in PRECISIONS.
#
#   OUT=/tmp/out bash bench/serve.sh       # on the GPU machine (logs: $OUT/serve.log)
#
# Environment: as bench/peer.sh (B, CC, DEPS, SKIP_BUILD, W, LAYERS, EXPERTS), plus PRECISIONS
# (default "precise fast": glm5-serve's default first), CLIENTS (default 1,8,32), PROMPT (512),
# TOKENS (128), ARGS (more glm5-serve options), TEMP (set: sampled clients at that temperature,
# prompt i with seed 1000 + i, the API's other defaults: no top-k, top-p 1), VERIFY (set: then
# each prompt alone, its output compared with the concurrent runs'), CENTRED (as bench/peer.sh: the model from `synth --centred`,
# for fast mode, whose prefill leaves fp16's range on most random prompts of the peer file; the
# same centring kept bench_decode's 78-layer model inside it, session 11; not yet run here).
# serve_load.py prints, per run, the engine time from /metrics (decode steps, ms per step, token
# draws, prefill). After each server's runs its /metrics draft, decode-step (count and seconds), prefill-seconds,
# token-draw-seconds and prefix-hit counters are printed
# (ARGS="--draft mtp": drafts made and accepted over all its runs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/g5serve-out}
W=${W:-/tmp/g5peer}
mkdir -p "$OUT" "$W"
source bench/common.sh
SECONDS=0
{
bench_header
bench_build "$OUT/build_serve.log" "$B/bin/glm5-shard" "$B/gpu/bin/glm5-serve" || exit 3
bench_peer_model || exit 3
rc=0
for p in ${PRECISIONS:-precise fast}; do
  log=$OUT/serve_$p.log
  echo "== glm5-serve --device cuda --precision $p --max-batch 32 --ctx-size 1024 ${ARGS:-}"
  "$B/gpu/bin/glm5-serve" -m "$blobs" --device cuda --precision "$p" --port 0 --max-batch 32 --ctx-size 1024 \
    ${ARGS:-} 2>"$log" &
  pid=$! port=""
  for k in $(seq 1 1200); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "glm5-serve did not start"; cat "$log"; rc=1; continue
  fi
  grep -E "model loaded|GPU " "$log" | head -2
  timeout 600 python3 bench/serve_load.py --port "$port" --clients "${CLIENTS:-1,8,32}" --prompt "${PROMPT:-512}" \
    --max-tokens "${TOKENS:-128}" ${VERIFY:+--verify} ${TEMP:+--temperature "$TEMP"} || { rc=1; grep -iE "error|fail" "$log" | head -5; }
  if exec 3<>/dev/tcp/127.0.0.1/"$port"; then # draft counters (--draft mtp) and decode steps, all runs together
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
    grep -E '^glm5_(draft|generation_tokens|decode_step|prefill_seconds|token_draw|prefix_cache_hits)' <&3 | tr '\n' ' '
    echo
    exec 3<&-
  fi
  kill -TERM $pid
  wait $pid
done
echo "serve.sh rc=$rc total ${SECONDS}s"
exit $rc
} 2>&1 | tee "$OUT/serve.log"
