#!/usr/bin/env bash
# The GPU runtime's stream check (`make test` runs it): runtime/gpu/*.c works on the ranks'
# streams, which are non-blocking (cudaStreamNonBlocking), so nothing orders them with the legacy
# default stream. A synchronous copy or memset (cudaMemcpy, cudaMemcpy2D, cudaMemset, ...) runs
# on that legacy stream, and from pageable host memory may return before its DMA has landed
# (CUDA's "API synchronization behavior"): kernels enqueued on a rank's stream after it can read
# the destination part-written. rt_gpu_debug_set_context did, and its context could differ run
# to run. So these calls are refused except in the functions of model creation listed in ALLOW,
# whose work setup_rank's cudaDeviceSynchronize completes before any stream runs; elsewhere use
# the *Async form on the stream that reads the data (rk->st).
#
#   bash scripts/check_gpu_streams.sh
#
# Prints `check_gpu_streams: N passed, N failed` last (the tree, then planted cases in a
# temporary tree); exits non-zero on any violation or failed self-test case.
set -u

# file function: a synchronous copy allowed there, and why
ALLOW='
runtime/gpu/gpu_model.c put_f32 model creation: setup_rank ends with cudaDeviceSynchronize
runtime/gpu/gpu_model.c load_rank_weights model creation: setup_rank ends with cudaDeviceSynchronize
'

# check ROOT ALLOW: prints "file:line: call in function" per violation, returns 1 if any.
check() {
    local root=$1 allow=$2 files
    files=$(cd "$root" && find runtime/gpu -maxdepth 1 -name '*.c' 2>/dev/null | sort)
    [ -n "$files" ] || { echo "check_gpu_streams: no runtime/gpu/*.c under $root"; return 1; }
    # shellcheck disable=SC2086
    (cd "$root" && awk -v allow="$allow" '
    BEGIN {
        n = split(allow, lines, "\n")
        for (i = 1; i <= n; i++) if (split(lines[i], w, " ") >= 2) ok[w[1] " " w[2]] = 1
        bad = 0
    }
    # the line without comments (incom: inside a /* */ that an earlier line opened)
    function strip(t,   out, i) {
        out = ""
        while (t != "") {
            if (incom) {
                i = index(t, "*/"); if (!i) return out
                t = substr(t, i + 2); incom = 0
            } else if (match(t, /\/\*|\/\//)) {
                out = out substr(t, 1, RSTART - 1)
                if (substr(t, RSTART, 2) == "//") return out
                t = substr(t, RSTART + 2); incom = 1
            } else return out t
        }
        return out
    }
    FNR == 1 { fn = ""; incom = 0 }
    {
        code = strip($0)
        # a definition starts in column 0: its name is the word before the first "("
        if (code ~ /^[A-Za-z_][A-Za-z_0-9 \t\*]*\(/) { s = code; sub(/\(.*/, "", s); sub(/.*[ \t\*]/, "", s); fn = s }
        if (match(code, /(^|[^A-Za-z_0-9])cuda(Memcpy|Memcpy2D|Memcpy3D|Memset|Memset2D|MemcpyToSymbol|MemcpyFromSymbol|MemcpyPeer)[ \t]*\(/)) {
            call = substr(code, RSTART, RLENGTH); sub(/^[^c]*/, "", call); sub(/[ \t]*\($/, "", call)
            if (!((FILENAME " " fn) in ok)) {
                print FILENAME ":" FNR ": " call " (legacy stream, synchronous) in " (fn == "" ? "file scope" : fn "()") \
                      ": use the Async form on the stream that reads it"
                bad = 1
            }
        }
    }
    END { exit bad }' $files)
}

[ $# -eq 0 ] || { echo "usage: $0 (from the repository root)" >&2; exit 2; }
passed=0; failed=0
if check . "$ALLOW"; then passed=$((passed + 1)); else
    echo "FAIL: synchronous CUDA copies in runtime/gpu (above; scripts/check_gpu_streams.sh)"
    failed=$((failed + 1))
fi

# the self-test: planted files in a temporary tree
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/runtime/gpu"
# expect NAME WANT BODY: a runtime/gpu/gpu_model.c of BODY must pass (WANT 0) or fail naming it (1)
expect() {
    printf '%b\n' "$3" >"$tmp/runtime/gpu/gpu_model.c"
    check "$tmp" "$ALLOW" >"$tmp/out" 2>&1
    local rc=$?
    if [ "$2" = 0 ] && [ $rc -eq 0 ]; then passed=$((passed + 1))
    elif [ "$2" = 1 ] && [ $rc -ne 0 ] && grep -q '^runtime/gpu/gpu_model.c:' "$tmp/out"; then passed=$((passed + 1))
    else echo "FAIL self-test $1 (want $2, got $rc):"; cat "$tmp/out"; failed=$((failed + 1)); fi
}
expect async 0 'static int f(void) {\n    return cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, st);\n}'
expect allowed 0 'static g5_status put_f32(gl_rank *rk) {\n    CUK_CHECK(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice));\n}'
expect comment 0 'static int f(void) {\n    /* not cudaMemcpy(d, h) */ return 0; // nor cudaMemset(d, 0, n)\n    /* nor\n     * cudaMemcpy (d, h) */\n}'
expect memcpy 1 'g5_status rt_gpu_debug_set_context(rt_gpu_model *g) {\n    ce = cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);\n}'
expect memset 1 'static int f(void) {\n    return cudaMemset (d, 0, n);\n}'
expect memcpy2d 1 'static int f(void) {\n    CUK_CHECK(cudaMemcpy2D(d, 4, h, 4, 4, 1, cudaMemcpyHostToDevice));\n}'
expect after-allowed 1 'static g5_status put_f32(void) {\n    return 0;\n}\nstatic int g(void) {\n    return cudaMemcpy(d, h, n, cudaMemcpyDeviceToDevice);\n}'
echo "check_gpu_streams: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
