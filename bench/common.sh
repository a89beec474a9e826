# Shared by the device benchmark scripts (bench/decode.sh, prefill.sh, load.sh): source it after
# `cd` to the repository root. Sets B, CC, DEPS from the environment (defaults: build/dev,
# /opt/gcc/bin/gcc when present, gpu-deps) and defines:
#   bench_header            the device, commit, cores and RAM (first lines of every log)
#   bench_build LOG TARGET  builds TARGET with the static dependencies of DEPS unless SKIP_BUILD=1;
#                           on failure prints the errors and returns non-zero
B=${B:-build/dev}
# The GPU machines have no network and no Debian -dev packages (gpu-deps/ stands in): the
# Makefile's dependency probe (scripts/deps.sh --if-missing) must not try to install them there.
export G5_NO_DEPS=1
CC=${CC:-$( [ -x /opt/gcc/bin/gcc ] && echo /opt/gcc/bin/gcc || echo gcc )}
DEPS=${DEPS:-gpu-deps}

bench_header() {
  echo "== device"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo ?)}; $(nproc) cores; $(free -g | awk '/Mem:/ {print $2 " GiB RAM"}')"
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
