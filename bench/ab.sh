#!/usr/bin/env bash
# A/B comparison of source trees in one device call: the working tree and named variants of it,
# built side by side (a variant is a copy of the working tree's build with its own files laid
# over, so only what they touch is rebuilt), then bench_peer on the trees alternated, so every
# figure has its baseline from the same call and machine (bench/RESULTS.md's practice).
#
#   bash bench/ab.sh prepare NAME=REV [NAME=REV ..]   # here: .dev/ab/NAME/ holds the files in which
#                                                       # REV differs from the working tree (and a
#                                                       # list of those REV lacks); carry .dev
#   bash bench/ab.sh prepare NAME=DIR                   # or the files under DIR (an overlay as is)
#   bash bench/ab.sh prepare NAME=A.patch[+B.patch]     # or the working tree's files with the patches
#                                                       # applied (prepared changes, not yet run)
#   OUT=/tmp/out bash bench/ab.sh run                   # on the GPU machine (logs: $OUT/ab.log)
#
# run: builds the working tree (glm5-shard, bench_peer, bench_q8, and with TESTGPU=1 every GPU
# target), then each .dev/ab/NAME tree in build/ab/NAME, makes the centred peer model meanwhile
# (bench/peer.sh's, in W) and with TESTGPU=1 runs `make test-gpu` on the working tree; then ROUNDS
# (default 2; PROUNDS, where set, for these alone) rounds of bench_peer over the trees in order
# (PEER: its options, default the batched step at depth 512: `--pp 512 --depth 512 --tg 16
# --batch 1,8,32 --reps 1`), and for each line of
# Q8 (`;`-separated bench_q8 arguments, e.g. "20 moe 32;20 Q5_K 6144 16384 32") bench_q8 in every
# tree; with DECODE=1, ROUNDS rounds of bench_decode (one TP 8 rank, bench/decode.sh's model; DEC:
# its options, default `--decode --layers 78 --ctx 1024,32768 --steps 20 --modes fast --graph on`)
# over the trees alternated, every variant then building bench_decode too; with PROFILE=1 then
# bench_peer --profile on the working tree (batch 1 and 32: $OUT/profile.log).
# $OUT keeps ab.log, test-gpu.log and profile.log; the build and per-run logs go into logs.tgz.
# bench/ab_table.py turns ab.log's round lines into RESULTS tables (differences from a base tree).
# A warm machine keeps the builds and the model (a second call rebuilds only what changed).
# Environment: as bench/peer.sh (B, CC, DEPS, W, LAYERS, EXPERTS); the variants run with the same.
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD
AB=.dev/ab

prepare() {
  rm -rf "$AB"
  mkdir -p "$AB"
  local spec name src f
  for spec in "$@"; do
    name=${spec%%=*}
    src=${spec#*=}
    case $name in '' | *[!A-Za-z0-9_-]*) echo "ab.sh: bad variant name in '$spec'" >&2; return 2 ;; esac
    mkdir -p "$AB/$name"
    if [ -d "$src" ]; then
      cp -r "$src/." "$AB/$name/"
    elif [ -f "${src%%+*}" ]; then # patches (a+b: in turn): the files they touch, copied, patched in the copy
      local pf
      for pf in ${src//+/ }; do
        [ -f "$pf" ] || { echo "ab.sh: no patch '$pf'" >&2; return 2; }
        git apply --numstat "$pf" | cut -f3 | while read -r f; do
          mkdir -p "$AB/$name/$(dirname "$f")"
          [ -f "$f" ] && [ ! -f "$AB/$name/$f" ] && cp "$f" "$AB/$name/$f"
        done
        git apply --unsafe-paths --directory="$AB/$name" "$pf" ||
          { echo "ab.sh: '$pf' does not apply to the working tree (after the ones before it)" >&2; return 2; }
      done
    else
      git rev-parse --verify -q "$src^{commit}" >/dev/null || { echo "ab.sh: '$src' is no revision, folder or patch" >&2; return 2; }
      # files REV has and the working tree has otherwise (or not at all), then those REV lacks
      git diff --name-only --no-renames --diff-filter=d -R "$src" -- . | while read -r f; do
        mkdir -p "$AB/$name/$(dirname "$f")"
        git show "$src:$f" >"$AB/$name/$f"
      done
      git diff --name-only --no-renames --diff-filter=D -R "$src" -- . >"$AB/$name.gone"
    fi
    echo "$name: $(find "$AB/$name" -type f | wc -l) file(s) over the working tree$([ -s "$AB/$name.gone" ] && echo ", $(wc -l <"$AB/$name.gone") removed")"
  done
}

# build/ab/NAME: the working tree's files with NAME's over them, and its own build. The device keeps
# ignored build output in the tree between calls of a warm machine but not /tmp, so the variants
# and the peer model live under build/. A first call copies the tree's build and its files with
# their times (nothing but what NAME's files touch is rebuilt); later calls copy only the files
# whose content differs. Copying every file afresh each call rebuilt the slow int8 GEMV units
# (about 220 s a variant) every call.
sync_variant() {
  local v=$1 d=$R/build/ab/$1 f src new=0
  if [ ! -d "$d/$B" ]; then
    rm -rf "$d" && mkdir -p "$d/$(dirname "$B")" && cp -a "$R/$B" "$d/$B" || return 1
    new=1
  fi
  { git -C "$R" ls-files -co --exclude-standard; (cd "$AB/$v" && find . -type f | sed 's|^\./||'); } | sort -u |
    while read -r f; do
      src=$R/$f
      [ -f "$AB/$v/$f" ] && src=$AB/$v/$f
      [ -f "$src" ] || continue
      [ -f "$AB/$v.gone" ] && grep -qxF "$f" "$AB/$v.gone" && continue
      cmp -s "$src" "$d/$f" && continue
      mkdir -p "$(dirname "$d/$f")"
      if [ $new = 1 ] && [ "$src" = "$R/$f" ]; then cp -p "$src" "$d/$f"; else cp "$src" "$d/$f"; fi
    done
  [ -f "$AB/$v.gone" ] && (cd "$d" && xargs -r rm -f <"$R/$AB/$v.gone")
  return 0
}

run() {
  OUT=${OUT:-/tmp/ab-out}
  W=${W:-$R/build/g5peer}
  mkdir -p "$OUT" "$W"
  export CENTRED=1
  # the oracle for make test-gpu: scripts/gpu-deps.sh's copy, carried with the tree
  [ -z "${GLM5_SHARED:-}" ] && [ -d "$R/oracle-carry/oracle" ] && export GLM5_SHARED=$R/oracle-carry
  source bench/common.sh
  DEPS=$(cd "$DEPS" && pwd) # the variants build in their own folders
  SECONDS=0
  bench_header
  local targets="$B/bin/glm5-shard $B/gpu/tests/bench_peer $B/gpu/tests/bench_q8" t v trees="$R"
  local vtargets="$B/bin/glm5-shard $B/gpu/tests/bench_peer $B/gpu/tests/bench_q8"
  [ "${DECODE:-0}" = 1 ] && targets="$targets $B/gpu/tests/bench_decode" && vtargets="$vtargets $B/gpu/tests/bench_decode"
  [ "${TESTGPU:-0}" = 1 ] && targets="gpu gpu-model $B/bin/glm5-shard"
  # shellcheck disable=SC2086
  bench_build "$OUT/build.log" $targets || return 3
  local names=""
  for d in "$AB"/*/; do [ -d "$d" ] && names="$names $(basename "$d")"; done
  (
    # the variants build side by side: each is bound by a few slow units on one core apiece
    for v in $names; do
      (
        sync_variant "$v"
        # a failed build must not leave the working tree's copied binaries to be measured as the variant
        # shellcheck disable=SC2086
        (cd "$R/build/ab/$v" && bench_build "$OUT/build_$v.log" $vtargets) ||
          { echo "variant $v: build failed, not run"; rm -f "$R/build/ab/$v/$B/gpu/tests/bench_peer"; }
      ) &
    done
    bench_peer_model || echo "peer model: failed"
    wait
    echo "side builds and model done in ${SECONDS}s"
  ) >"$OUT/side.log" 2>&1 &
  local bg=$! rc=0
  if [ "${TESTGPU:-0}" = 1 ]; then
    local t0=$SECONDS
    make CC="$CC" BUILD="$B" EXTRA_CFLAGS="-isystem $DEPS/include -Wno-error" EXTRA_LDFLAGS="-L$DEPS/lib" \
      TEST_JOBS=8 test-gpu >"$OUT/test-gpu.log" 2>&1 || rc=1
    echo "make test-gpu rc=$rc in $((SECONDS - t0))s: $(tail -1 "$OUT/test-gpu.log")"
    grep -E "passed" "$OUT/test-gpu.log" | grep -v " 0 failed" | head -20
  fi
  wait "$bg"
  cat "$OUT/side.log"
  local sfx=${CENTRED:+-centred}
  blobs=$W/tp1$sfx
  for v in $names; do [ -x "$R/build/ab/$v/$B/gpu/tests/bench_peer" ] && trees="$trees $R/build/ab/$v"; done
  local r
  for r in $(seq 1 "${PROUNDS:-${ROUNDS:-2}}"); do
    for t in $trees; do
      # shellcheck disable=SC2086
      timeout "${LIMIT:-200}" "$t/$B/gpu/tests/bench_peer" -m "$blobs" --precision fast \
        ${PEER:---pp 512 --depth 512 --tg 16 --batch 1,8,32 --reps 1} >"$OUT/peer_$(basename "$t")_$r.log" 2>&1 || rc=1
      echo "round $r $(basename "$t"): $(grep -oE '(tg[0-9]+|batch [0-9]+) @ [0-9]+ fast: [0-9.]+ tok/s( aggregate)? \([0-9.]+ ms' \
        "$OUT/peer_$(basename "$t")_$r.log" | sed 's/ fast//; s/ tok\/s aggregate (/ tok\/s, /; s/ tok\/s (/ tok\/s, /' |
        tr '\n' ';')"
    done
  done
  local line q8s=()
  IFS=';' read -ra q8s <<<"${Q8:-}"
  for line in "${q8s[@]}"; do
    for t in $trees; do
      # shellcheck disable=SC2086
      echo "bench_q8 $line, $(basename "$t"): $(timeout 120 "$t/$B/gpu/tests/bench_q8" $line 2>&1 | grep '^| [a-zA-Z]' | tail -2 | tr '\n' ' ')"
    done
  done
  for r in $(seq 1 "$([ "${DECODE:-0}" = 1 ] && echo "${ROUNDS:-2}" || echo 0)"); do
    for t in $trees; do
      local dl
      dl="$OUT/dec_$(basename "$t")_$r.log"
      # shellcheck disable=SC2086
      (cd "$t" && timeout "${LIMIT:-200}" "$B/gpu/tests/bench_decode" \
        ${DEC:---decode --layers 78 --ctx 1024,32768 --steps 20 --modes fast --graph on}) >"$dl" 2>&1 || rc=1
      echo "decode round $r $(basename "$t"): $(grep -E '^decode ' "$dl" | sed 's/ median of.*RATIO/, ratio/; s/ (vs.*//' |
        tr -s ' ' | tr '\n' ';')"
    done
  done
  if [ "${PROFILE:-0}" = 1 ]; then # the working tree's sub-step tables, one token and batch 32
    timeout 120 "$R/$B/gpu/tests/bench_peer" -m "$blobs" --precision fast --pp 512 --depth 512 --tg 16 --batch 1,32 \
      --reps 1 --profile >"$OUT/profile.log" 2>&1 || rc=1
    echo "profile: $OUT/profile.log"
  fi
  # the device tool brings back at most 8 files: the per-run logs go back as one archive
  (cd "$OUT" && tar -czf logs.tgz --remove-files build*.log peer_*.log dec_*.log side.log 2>/dev/null)
  echo "ab.sh rc=$rc total ${SECONDS}s"
  return $rc
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; OUT=${OUT:-/tmp/ab-out}; mkdir -p "$OUT"; run "$@" 2>&1 | tee "$OUT/ab.log"; exit "${PIPESTATUS[0]}" ;;
  *) echo "usage: bash bench/ab.sh prepare NAME=REV|NAME=DIR ... | run" >&2; exit 2 ;;
esac
