#!/usr/bin/env bash
# Builds and runs check_load: runtime/gpu/gpu_load.c's threading tested on the CPU against
# cuda_stub.c (no GPU needed; the CUDA headers are). SAN=thread or SAN=address,undefined adds a
# sanitizer. Needs the format library: make BUILD=$B first.
#   B=build/dev bash tests/gpu/load_stub/run.sh
set -eu
cd "$(dirname "$0")/../../.."
B=${B:-build/dev}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=$B/load_stub
mkdir -p "$OUT"
${CC:-cc} -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -pthread -I. -DG5_WITH_CUDA -isystem "$CUDA_HOME/include" \
  ${SAN:+-fsanitize=$SAN} ${EXTRA_CFLAGS:-} runtime/gpu/gpu_load.c tests/gpu/load_stub/check_load.c tests/gpu/load_stub/cuda_stub.c \
  "$B/lib/libg5format.a" ${EXTRA_LDFLAGS:-} -lxxhash -lzstd -lm -o "$OUT/check_load"
"$OUT/check_load"
