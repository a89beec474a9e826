#!/usr/bin/env bash
# `make demo`: the whole job on a small synthetic GLM-5, in a few minutes on a fresh machine.
#   1. dependencies (scripts/deps.sh; as root, or through sudo)
#   2. build glm5-shard
#   3. synth: a GGUF with the tiny oracle's dimensions and GLM-5's exact layout
#   4. inspect + architecture audit of that GGUF
#   5. convert at tensor-parallel degree 2 into per-rank checksummed blobs
#   6. verify every checksum, and re-derive every slice from the GGUF (--deep)
#   7. inspect the blob set
#   8. a refusal: T = 4 would cut a Q5_K row inside a 256-element block
#   9. generate text with glm5-run from the TP 2 blobs (random weights: the text is noise)
# Output goes to $DEMO_DIR (default $BUILD/demo, BUILD default build); full reports are kept
# there, the console shows the essentials.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
DEMO=${DEMO_DIR:-$BUILD/demo}
BIN=$BUILD/bin/glm5-shard
start=$(date +%s)

step() { printf '\n==> %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

step "1/9 dependencies"
if [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; then
  bash scripts/deps.sh
else
  echo "not root and no sudo: skipping scripts/deps.sh (run it as root if the build fails)"
fi

step "2/9 build"
jobs=$(nproc 2>/dev/null || echo 2)
[ "$jobs" -gt 4 ] && jobs=4
run make -s -j"$jobs" BUILD="$BUILD" "$BIN" "$BUILD/bin/glm5-run"

rm -rf "$DEMO"
mkdir -p "$DEMO"
MODEL=$DEMO/glm5-tiny-synth.gguf
OUT=$DEMO/tp2

step "3/9 synth: a tiny GLM-5 (random weights, real glm-dsa layout, UD-Q4_K_XL-like types)"
run "$BIN" synth --preset tiny --seed 1 -o "$MODEL"

step "4/9 inspect + architecture audit (full report: $DEMO/inspect-gguf.txt)"
printf '$ %s\n' "$BIN inspect $MODEL"
"$BIN" inspect "$MODEL" >"$DEMO/inspect-gguf.txt"
sed -n '/^totals by type/,$p' "$DEMO/inspect-gguf.txt"

step "5/9 convert at TP 2"
run "$BIN" convert --tp 2 -o "$OUT" "$MODEL"
ls -l "$OUT"

step "6/9 verify (all checksums; --deep re-derives every slice and kv_b from the GGUF)"
run "$BIN" verify "$OUT" --deep "$MODEL"

step "7/9 inspect the blob set (full report: $DEMO/inspect-blobs.txt)"
printf '$ %s\n' "$BIN inspect $OUT"
"$BIN" inspect "$OUT" >"$DEMO/inspect-blobs.txt"
sed -n '1,/^tensors (/p' "$DEMO/inspect-blobs.txt" | sed '$d'
tail -n 1 "$DEMO/inspect-blobs.txt"

step "8/9 a refusal (expected): TP 4 would split ffn_down_exps (Q5_K, 256-element blocks) into 128-wide slices"
printf '$ %s\n' "$BIN convert --tp 4 -o $DEMO/tp4 $MODEL"
if "$BIN" convert --tp 4 --quiet -o "$DEMO/tp4" "$MODEL"; then
  echo "demo: FAILED (TP 4 was expected to be refused)"
  exit 1
fi
[ -e "$DEMO/tp4/blobset.g5s" ] && { echo "demo: FAILED (a refused conversion left a set)"; exit 1; }
echo "(refused before writing anything, as it should be)"

step "9/9 generate: glm5-run on the 2 rank blobs (CPU reference path; random weights, so noise)"
run "$BUILD/bin/glm5-run" -m "$OUT" -p "Hello, GLM-5" -n 16 --seed 1
echo
run "$BUILD/bin/glm5-run" -m "$OUT" -p "Hello, GLM-5" -n 16 --ids

printf '\ndemo OK in %ss: %s -> %s (2 ranks)\n' "$(($(date +%s) - start))" "$MODEL" "$OUT"
