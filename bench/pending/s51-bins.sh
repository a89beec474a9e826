#!/usr/bin/env bash
# Builds the binaries of a prebuilt A/B (bench/pending/s52-next.sh) here, without a GPU:
#   bash bench/pending/s51-bins.sh DIR NAME[=PATCH[+PATCH..]] ..
# For each NAME, bench_decode of HEAD with the patches (bench/pending/*.patch, applied in order)
# as DIR/dec_NAME.xz, stripped and xz'd; T=NAME also writes that tree's test programs TESTS
# (default test_gemv_q8) as DIR/t_PROG.xz (test_ dropped). Each tree builds in its own worktree
# under /tmp (a cold build of everything those targets link; written in session 51, not yet run).
# Needs gpu-deps/ (GLM5_SHARED=... bash scripts/gpu-deps.sh). Example (session 51's shape; its
# patches were decided in session 52 and deleted):
#   T=v TESTS="test_gemv_q8 test_kernels" bash bench/pending/s51-bins.sh .dev/bins9 b v=NAME.patch
set -eu
cd "$(dirname "$0")/../.."
root=$PWD
dir=$1
shift
mkdir -p "$dir"
for spec in "$@"; do
  name=${spec%%=*}
  patches=
  [ "$spec" != "$name" ] && patches=${spec#*=}
  wt=/tmp/g5bins-$name
  git worktree remove --force "$wt" 2>/dev/null || true
  git worktree add -q --detach "$wt" HEAD
  for p in ${patches//+/ }; do git -C "$wt" apply "$root/bench/pending/$p"; done
  tgt="build/lm/gpu/tests/bench_decode"
  tests=${TESTS:-test_gemv_q8}
  if [ "${T:-}" = "$name" ]; then for t in $tests; do tgt="$tgt build/lm/gpu/tests/$t"; done; fi
  # shellcheck disable=SC2086 # tgt: one or two targets
  make -C "$wt" -j"$(nproc)" CC=gcc BUILD=build/lm CUDA_ARCH=90 CUDA_PTX= MPI=0 G5_NO_DEPS=1 \
    EXTRA_CFLAGS="-isystem $root/gpu-deps/include -Wno-error" EXTRA_LDFLAGS="-L$root/gpu-deps/lib" $tgt >"/tmp/g5bins-$name.log" 2>&1
  strip -o "/tmp/dec_$name" "$wt/build/lm/gpu/tests/bench_decode"
  xz -9 -c "/tmp/dec_$name" >"$dir/dec_$name.xz"
  if [ "${T:-}" = "$name" ]; then
    for t in $tests; do
      strip -o "/tmp/t_${t#test_}" "$wt/build/lm/gpu/tests/$t"
      xz -9 -c "/tmp/t_${t#test_}" >"$dir/t_${t#test_}.xz"
    done
  fi
  git worktree remove --force "$wt"
done
ls -la "$dir"
