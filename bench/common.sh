# Shared by the device benchmark scripts (bench/decode.sh, prefill.sh, load.sh): source it after
# `cd` to the repository root. Sets B, CC, DEPS from the environment (defaults: build/dev,
# /opt/gcc/bin/gcc when present, gpu-deps) and defines:
#   bench_header            the device, commit, cores and RAM (first lines of every log)
#   bench_build LOG TARGET  builds TARGET with the static dependencies of DEPS unless SKIP_BUILD=1;
#                           on failure prints the errors and returns non-zero
#   bench_peer_model        the peer model in W (bench/peer.sh, bench/serve.sh): synth (LAYERS,
#                           EXPERTS, CENTRED) and a TP 1 conversion where missing; sets gguf, blobs
B=${B:-build/dev}
# The GPU machines have no network and no Debian -dev packages (gpu-deps/ stands in): the
# Makefile's dependency probe (scripts/deps.sh --if-missing) must not try to install them there.
export G5_NO_DEPS=1
CC=${CC:-$( [ -x /opt/gcc/bin/gcc ] && echo /opt/gcc/bin/gcc || echo gcc )}
DEPS=${DEPS:-gpu-deps}
# Build for the device's own architecture alone: the field default (CUDA_ARCH "90 120", cuda/cuda.mk)
# runs ptxas twice for every kernel, which doubled the device's builds (the sm_90 code is the same).
# Exported, so that every make here (ab.sh's make test-gpu too) sees the same arch stamp and none
# of them rebuilds all of cuda/ for another target set.
if [ -z "${CUDA_ARCH:-}" ]; then
  _cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  case $_cap in [0-9][0-9] | [0-9][0-9][0-9]) export CUDA_ARCH=$_cap CUDA_PTX=$_cap ;; esac
  unset _cap
fi

bench_header() {
  echo "== device"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo ?)}; $(nproc) cores; $(free -g | awk '/Mem:/ {print $2 " GiB RAM"}'); CUDA_ARCH ${CUDA_ARCH:-default}"
}

bench_build() {
  local log=$1; shift
  [ "${SKIP_BUILD:-0}" = 1 ] && return 0
  local t0=$SECONDS rc
  echo "== build ($*; $CC)"
  make -j"$(nproc)" CC="$CC" BUILD="$B" EXTRA_CFLAGS="-isystem $DEPS/include -Wno-error" \
    EXTRA_LDFLAGS="-L$DEPS/lib" "$@" >"$log" 2>&1
  rc=$?
  echo "build rc=$rc in $((SECONDS - t0))s"
  [ $rc = 0 ] || grep -E "error|Error" "$log" | head -30
  return $rc
}

bench_peer_model() {
  local sfx=${CENTRED:+-centred} t0
  gguf=$W/peer-${LAYERS:-12}x${EXPERTS:-64}$sfx.gguf
  blobs=$W/tp1$sfx
  if [ ! -f "$gguf" ] && [ ! -f "$blobs/blobset.g5s" ]; then
    t0=$SECONDS
    "$B/bin/glm5-shard" synth --preset glm5 --layers "${LAYERS:-12}" --experts "${EXPERTS:-64}" ${CENTRED:+--centred} \
      -o "$gguf" || return 1
    echo "synth $(du -h "$gguf" | cut -f1) in $((SECONDS - t0)) s"
  fi
  if [ ! -f "$blobs/blobset.g5s" ]; then
    t0=$SECONDS
    "$B/bin/glm5-shard" convert --tp 1 --quiet -o "$blobs" "$gguf" || return 1
    echo "convert TP 1 in $((SECONDS - t0)) s"
  fi
}
