#!/usr/bin/env bash
# Session 40's first device call: s39-sx8-pick.patch (cuk_gemv_q8t takes the x-staged form with 8
# column tiles for two planes of 17-32 vectors on the shapes where bench_q8 measured it faster:
# bench/RESULTS.md "Session 39"; the same bits, test_gemv_q8 checks them) against HEAD.
#   bash bench/pending/s39-next.sh here   # applies the patch, prepares head=HEAD (ab.sh)
#   device call 1: bash bench/pending/s39-next.sh test   # make test-gpu on the patched tree, two
#                                                        # peer rounds, two TP 8 decode rounds
# carry gpu-deps, oracle-carry and .dev. Land it where batch 32 (and batch 8's 17+ rows: none on
# the peer model) gains in both rounds and one token does not move (it never takes this path).
set -u
cd "$(dirname "$0")/../.." || exit 2
case "${1:-}" in
here)
  git apply bench/pending/s39-sx8-pick.patch || { echo "s39-sx8-pick.patch does not apply" >&2; exit 2; }
  bash bench/ab.sh prepare head=HEAD || exit 2
  ;;
test)
  TESTGPU=1 ROUNDS=2 LIMIT=60 PEER="--pp 512 --depth 512 --tg 16 --batch 1,8,32 --reps 1" \
    bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  echo "ab.sh rc=$?"
  grep -E "make test-gpu|build rc|side builds" "$OUT/ab.log" | head
  grep -E "FAIL" "$OUT/test-gpu.log" | head -20
  python3 bench/ab_table.py "$OUT/ab.log" head
  ;;
*) echo "usage: $0 here|test" >&2; exit 2 ;;
esac
