#!/usr/bin/env bash
# Installs the Debian packages glm5-shard builds and tests with. Idempotent: installs only what
# is missing, so a second run does nothing. Run as root (or with sudo available).
set -euo pipefail

pkgs=(
  make gcc pkg-config
  libxxhash-dev      # XXH3-128 checksums
  libzstd-dev        # blob metadata compression
  libpcre2-dev       # tokenizer pre-tokenizer regex (UTF + Unicode properties)
  libjansson-dev     # JSON: tests against the oracle, --json output, server
  libmicrohttpd-dev  # glm5-serve
  clang libclang-rt-dev  # libFuzzer targets (make fuzz)
  openmpi-bin libopenmpi-dev  # several processes under mpirun/srun (runtime/cpu/comm.c, tests/test_mpi)
)

# --if-missing (what `make`, `make test` and `make gpu` run first): a cheap probe of the build's
# headers and Open MPI's pkg-config entry; silent when all are present, else the install below.
if [ "${1:-}" = "--if-missing" ]; then
  probe() {
    printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' '#include <sys/types.h>' \
      '#include <sys/socket.h>' '#include <xxhash.h>' '#include <zstd.h>' \
      '#define PCRE2_CODE_UNIT_WIDTH 8' '#include <pcre2.h>' '#include <jansson.h>' \
      '#include <microhttpd.h>' | "${CC:-cc}" ${EXTRA_CFLAGS:-} -E -x c - >/dev/null 2>&1 || return 1
    # MPI=0 builds, and G5_MPI_HOME bundles (scripts/gpu-mpi.sh), need no system Open MPI
    [ "${MPI:-auto}" = 0 ] || [ -n "${G5_MPI_HOME:-}" ] && return 0
    pkg-config --exists ompi-c 2>/dev/null || pkg-config --exists mpi 2>/dev/null
  }
  probe && exit 0
  echo "deps: the build's headers or Open MPI are missing; running scripts/deps.sh" >&2
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
