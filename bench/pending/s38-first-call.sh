#!/usr/bin/env bash
# Session 39's device calls. Session 38 learned that a set of changes has to be compared with the
# untouched HEAD, each change alone, in the same call (bench/RESULTS.md "Session 38": the four
# patches of session 37 helped one another and lost together). So every variant here is HEAD
# plus one change, and the working tree (all of them) is what make test-gpu checks:
# - s38-uv-pdl.patch: the decode W_UV (k_head_gemv) becomes a programmatic dependent launch that
#   loads its weights before pdl_wait, and decode's attention (k_mla_dec) triggers its dependents
#   at its start. With kv_b's exact int8 form (landed in session 38) W_UV is one wave (10.5 MB at
#   TP 1, 1.3 MB a TP 8 rank), so all of it can load while the attention runs. Adds cuda/pdl.cuh.
# - s36-g1.patch, s36-pdl-gemv.patch, s36-aux.patch: session 36's (git history 149ac36); inside
#   session 37's set they looked worth 0.04-0.08, 0.11 and 0.08 ms a step; never run alone
#   against HEAD. pdl-gemv uses cuda/pdl.cuh, so its variant is uv-pdl + pdl-gemv (`pdlg`).
#   bash bench/pending/s38-first-call.sh here   # applies the four, prepares head, uvpdl, g1, pdlg, aux
#   device call 1: bash bench/pending/s38-first-call.sh test   # make test-gpu + peer rounds (~450 s)
#   device call 2 (warm): bash bench/pending/s38-first-call.sh dec    # TP 8 decode rounds
#   device call 3 (warm, after landing): bash bench/pending/s38-first-call.sh readme
# carry gpu-deps, oracle-carry and .dev. Land a change where its variant beats head at one token
# in both rounds (tg16 @ 512 and batch 1 @ 512) and loses nowhere by more than the rounds' spread.
set -u
cd "$(dirname "$0")/../.." || exit 2
P=bench/pending
ALL="$P/s38-uv-pdl.patch $P/s36-g1.patch $P/s36-pdl-gemv.patch $P/s36-aux.patch"
case "${1:-}" in
here)
  for p in $ALL; do git apply "$p" || { echo "$p does not apply" >&2; exit 2; }; done
  # variant $1: HEAD's copies of every file the four touch (a file HEAD lacks, cuda/pdl.cuh, stays
  # the tree's: nothing includes it unless a patch does), with patches $2.. applied in order
  only() {
    local v=$1 p f
    shift
    rm -rf "/tmp/v-$v" || return 1
    for p in $ALL; do
      git apply --numstat "$p" | cut -f3 | while read -r f; do
        git cat-file -e "HEAD:$f" 2>/dev/null || continue
        mkdir -p "/tmp/v-$v/$(dirname "$f")" && git show "HEAD:$f" >"/tmp/v-$v/$f"
      done
    done
    for p in "$@"; do
      git apply --unsafe-paths --directory="/tmp/v-$v" --exclude=cuda/pdl.cuh "$p" || return 1
    done
  }
  only uvpdl $P/s38-uv-pdl.patch || exit 2
  only g1 $P/s36-g1.patch || exit 2
  only pdlg $P/s38-uv-pdl.patch $P/s36-pdl-gemv.patch || exit 2
  only aux $P/s36-aux.patch || exit 2
  bash bench/ab.sh prepare head=HEAD uvpdl=/tmp/v-uvpdl g1=/tmp/v-g1 pdlg=/tmp/v-pdlg aux=/tmp/v-aux || exit 2
  ;;
test) # make test-gpu on the tree (all four), then the peer rounds over six trees
  TESTGPU=1 ROUNDS=2 LIMIT=60 PEER="--pp 512 --depth 512 --tg 16 --batch 1,8,32 --reps 1" \
    bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  echo "ab.sh rc=$?"
  grep -E "make test-gpu|build rc|side builds|^round" "$OUT/ab.log" | head -30
  grep -E "FAIL" "$OUT/test-gpu.log" | head -20
  python3 bench/ab_table.py "$OUT/ab.log"
  ;;
dec) # the TP 8 rank's decode rounds (six trees), then the tree's sub-step profile (batch 1, 32)
  DECODE=1 ROUNDS=2 PROUNDS=0 LIMIT=90 PROFILE=1 bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "^decode round|rc=|side builds" "$OUT/ab.log"
  python3 bench/ab_table.py "$OUT/ab.log"
  ;;
readme) # on the tree as landed: the README's rows (the peer model of call 1 reused)
  W=$PWD/build/g5peer CENTRED=1 LONG=0 PRECISIONS=fast bash bench/peer.sh >"$OUT/peer.out" 2>&1
  echo "peer.sh rc=$?"
  W=$PWD/build/g5peer SKIP_BUILD=0 CENTRED=1 PRECISIONS=fast VERIFY=1 bash bench/serve.sh >"$OUT/serve.out" 2>&1
  echo "serve.sh rc=$?"
  tail -25 "$OUT/peer.out"; tail -12 "$OUT/serve.out"
  ;;
*) echo "usage: $0 here|test|dec|readme" >&2; exit 2 ;;
esac
