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
