#!/usr/bin/env bash
# Prepares the folders a device call carries (the GPU machine has no network and none of our
# Debian libraries): gpu-deps/ with static xxhash, zstd, pcre2, jansson and libmicrohttpd and
# their headers, copied from this machine's -dev packages (scripts/deps.sh installs them), with
# gpu-deps/mpi/ (Open MPI, scripts/gpu-mpi.sh) when it is installed here, and oracle-carry/oracle/
# with a copy of the reference data. Both are git-ignored; name them in the device call's `carry`
# and set GLM5_SHARED=$PWD/oracle-carry there (see tests/gpu/run_device.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
lib=/usr/lib/$(gcc -print-multiarch)
mkdir -p gpu-deps/lib gpu-deps/include
for a in libxxhash.a libzstd.a libpcre2-8.a libjansson.a libmicrohttpd.a; do
  cp "$lib/$a" gpu-deps/lib/
done
for h in xxhash.h zstd.h zstd_errors.h pcre2.h jansson.h jansson_config.h microhttpd.h; do
  cp "/usr/include/$h" gpu-deps/include/
done
# gpu-deps/mpi/: a relocatable Open MPI for runs under mpirun on the device (scripts/gpu-mpi.sh)
if [ -x /usr/bin/orterun ]; then bash scripts/gpu-mpi.sh; fi
shared=${GLM5_SHARED:-../shared}
if [ -d "$shared/oracle" ]; then
  mkdir -p oracle-carry
  rm -rf oracle-carry/oracle
  cp -r "$shared/oracle" oracle-carry/oracle
fi
du -sh gpu-deps oracle-carry 2>/dev/null || true
