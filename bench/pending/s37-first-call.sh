#!/usr/bin/env bash
# Session 38's device calls for session 36's changes (bench/RESULTS.md, "Session 37"): six of
# the seven ran on the peer model in session 37 (router-route lost and is gone), but 547ff23 (the
# tree without them) did not run in the same call, and the TP 8 rank's decode rounds did not run.
# bench/pending/s37-decode.patch is the six together: s36-aux, s36-absorb-early, s36-g1,
# s36-absorb-one, s36-pdl-trig and s36-pdl-gemv (their separate patches are in git history,
# 149ac36). Variants: head = HEAD's files (the tree without the six), nog1 = the tree without
# s36-g1 (it reverse-applies to gemv_q8_kern.cuh alone).
#   bash bench/pending/s37-first-call.sh here   # applies s37-decode.patch, prepares head and nog1
#   device call 1: bash bench/pending/s37-first-call.sh test  # make test-gpu on the tree, the
#                                   # variants built meanwhile (all kept under build/ for call 2)
#   device call 2 (warm): bash bench/pending/s37-first-call.sh ab  # peer and TP 8 decode rounds
# carry gpu-deps, oracle-carry and .dev. Land the six if main beats head in both; nog1 decides g1.
set -u
cd "$(dirname "$0")/../.." || exit 2
case "${1:-}" in
here)
  git apply bench/pending/s37-decode.patch || { echo "s37-decode.patch does not apply" >&2; exit 2; }
  rm -rf /tmp/v-nog1 && mkdir -p /tmp/v-nog1/cuda && cp cuda/gemv_q8_kern.cuh /tmp/v-nog1/cuda/ &&
    git show 149ac36:bench/pending/s36-g1.patch >/tmp/s36-g1.patch &&
    git apply -R --include="*/cuda/gemv_q8_kern.cuh" --unsafe-paths --directory=/tmp/v-nog1 /tmp/s36-g1.patch || exit 2
  bash bench/ab.sh prepare head=HEAD nog1=/tmp/v-nog1 || exit 2
  ;;
test)
  TESTGPU=1 DECODE=1 ROUNDS=0 bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "make test-gpu|passed|variant|build rc|side builds|peer model" "$OUT/ab.log" | grep -v " 0 failed$" | head -20
  ;;
ab)
  DECODE=1 ROUNDS=2 LIMIT=90 PEER="--pp 512 --depth 512,4096 --tg 16 --batch 1,8,32 --reps 1" \
    bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "^round|^decode round|rc=|side builds" "$OUT/ab.log"
  ;;
*) echo "usage: $0 here|test|ab" >&2; exit 2 ;;
esac
