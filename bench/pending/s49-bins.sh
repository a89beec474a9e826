#!/usr/bin/env bash
# Rebuilds here the device binaries of bench/NOTES.md session 49 when .dev/ is gone: from HEAD and
# the pending patches, in a temporary worktree (removed after), into .dev/bins4 (dec_h, dec_qr,
# dec_qrnp, t_kernels) and .dev/bins5 (dec_h, dec_abl1..3). Needs gpu-deps/ (scripts/gpu-deps.sh)
# and nvcc; about 10 min on 2 cores (s49-qrot.patch changes cuda/cuk_model.h: every unit builds).
set -eu
cd "$(dirname "$0")/../.."
root=$PWD
w=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$w" >/dev/null 2>&1 || true; rm -rf "$w"' EXIT
git worktree add -q --detach "$w" HEAD
DEV=${DEV:-.dev} # where bins4 and bins5 go
mkdir -p "$DEV/bins4" "$DEV/bins5"
build() { # targets...: built in $w/build/b
  make -C "$w" -j"$(nproc)" CC=gcc BUILD=build/b CUDA_ARCH=90 CUDA_PTX= MPI=0 G5_NO_DEPS=1 \
    EXTRA_CFLAGS="-isystem $root/gpu-deps/include -Wno-error" EXTRA_LDFLAGS="-L$root/gpu-deps/lib" \
    "$@" >"$w/build.log" 2>&1 || { tail -20 "$w/build.log"; exit 1; }
}
pack() { # binary name dirs...: stripped, xz'd as dir/name.xz
  local b=$1 n=$2
  shift 2
  strip -o "$w/$n" "$w/build/b/gpu/tests/$b"
  xz -9 -c "$w/$n" >"$w/$n.xz"
  for d in "$@"; do cp "$w/$n.xz" "$d/"; done
  echo "$n"
}
build build/b/gpu/tests/bench_decode
pack bench_decode dec_h "$DEV/bins4" "$DEV/bins5"
git -C "$w" apply "$root/bench/pending/s49-mladec-ablate.patch"
for a in 1 2 3; do
  sed -i "s/^#define MLA_ABL .*/#define MLA_ABL $a/" "$w/cuda/attn_dec.cu"
  build build/b/gpu/tests/bench_decode
  pack bench_decode "dec_abl$a" "$DEV/bins5"
done
git -C "$w" checkout -q -- cuda/attn_dec.cu
git -C "$w" apply "$root/bench/pending/s49-qrot.patch"
build build/b/gpu/tests/bench_decode build/b/gpu/tests/test_kernels
pack bench_decode dec_qr "$DEV/bins4"
pack test_kernels t_kernels "$DEV/bins4"
sed -i 's/at\[1\].val.programmaticStreamSerializationAllowed = 1;/at[1].val.programmaticStreamSerializationAllowed = 0;/' \
  "$w/cuda/gemv_wide.cu"
grep -q "programmaticStreamSerializationAllowed = 0" "$w/cuda/gemv_wide.cu"
build build/b/gpu/tests/bench_decode
pack bench_decode dec_qrnp "$DEV/bins4"
