#!/usr/bin/env bash
# The layering check (`make test` runs it before the suite): fails when a library file includes
# across a forbidden edge. Dependencies point one way (README.md "Layout"):
#
#   format/          format/ only
#   convert/         format/
#   cuda/            format/quant.h (the type table; format/quant_blocks.h, its decoders shared
#                    with the device), format/det_exp.h (the sampler's arithmetic, shared with
#                    the device) and format/status.h only
#   runtime/cpu/     format/
#   runtime/text/    format/
#   runtime/gpu/     runtime/cpu/, cuda/, format/
#   runtime/*.{c,h}  (engine, draft) runtime/cpu/, runtime/gpu/, runtime/text/, format/
#   runtime/serve/   the above: runtime/*.h, cpu, gpu, text, format/
#   runtime/cli/     the above and runtime/serve/
#   tests/ bench/ fuzz/ scripts/   anything (not checked)
#
# Besides: quoted includes name the file from the repository root ("runtime/cpu/model.h") or,
# without a slash, a file of the same folder; never "..". A private header (*_int.h,
# *_internal.cuh, *_impl.h) is included from its own folder only. CUDA, cuBLAS and NCCL headers
# appear only in cuda/ and runtime/gpu/ (elsewhere only in a branch that nvcc alone takes:
# #ifdef __CUDACC__); <mpi.h> only in runtime/cpu/comm.c.
# ALLOW below lists the edges still waiting for their fix, each with the reason; one that no
# longer occurs is reported so that it can be deleted.
#
#   bash scripts/check_includes.sh [--root DIR] [--no-self-test]
#
# Without --no-self-test it then checks itself: planted forbidden includes in a temporary tree
# must each fail the check, a clean tree must pass. Prints `check_includes: N passed, N failed`
# last; exits non-zero on any violation or failed self-test case.
set -u

ALLOW='
'

# check ROOT ALLOW: prints one line per violation ("file:line: reason"), returns 1 if any.
check() {
    local root=$1 allow=$2 files
    files=$(cd "$root" && find format convert cuda runtime -type f \
            \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | sort)
    [ -n "$files" ] || { echo "check_includes: no library sources under $root"; return 1; }
    # shellcheck disable=SC2086
    (cd "$root" && grep -HnE '^[[:space:]]*#[[:space:]]*(include[[:space:]]*[<"]|if|elif|else|endif)' $files) |
    awk -v allow="$allow" '
    function room(p,   a, n) {
        n = split(p, a, "/")
        if (a[1] == "runtime") return n >= 3 ? "runtime/" a[2] : "runtime"
        return a[1]
    }
    function dirname(p) { sub(/\/[^\/]*$/, "", p); return p }
    function basename(p) { sub(/.*\//, "", p); return p }
    BEGIN {
        ok["format"] = " format "
        ok["convert"] = " convert format "
        ok["cuda"] = " cuda format/quant.h format/quant_blocks.h format/det_exp.h format/status.h "
        ok["runtime/cpu"] = " runtime/cpu format "
        ok["runtime/text"] = " runtime/text format "
        ok["runtime/gpu"] = " runtime/gpu runtime/cpu cuda format "
        ok["runtime"] = " runtime runtime/cpu runtime/gpu runtime/text format "
        ok["runtime/serve"] = " runtime/serve runtime runtime/cpu runtime/gpu runtime/text format "
        ok["runtime/cli"] = " runtime/cli runtime/serve runtime runtime/cpu runtime/gpu runtime/text format "
        n = split(allow, lines, "\n")
        for (i = 1; i <= n; i++) {
            if (split(lines[i], w, " ") < 2) continue
            allowed[w[1] " " w[2]] = 1; unused[w[1] " " w[2]] = 1
        }
        bad = 0
    }
    {
        file = $0; sub(/:.*/, "", file)
        rest = substr($0, length(file) + 2); line = rest; sub(/:.*/, "", line)
        text = substr(rest, length(line) + 2)
        from = room(file); sys = ""; inc = ""; target = ""; why = ""
        if (file != cur) { cur = file; depth = 0 }
        # if-nesting: guard[d] is 1 inside a branch that only nvcc takes (__CUDACC__ or __CUDA_ARCH__)
        if (text ~ /^[ \t]*#[ \t]*if/) { guard[++depth] = text ~ /__CUDACC__|__CUDA_ARCH__/ && text !~ /!|ifndef/; next }
        if (text ~ /^[ \t]*#[ \t]*(elif|else)/) { if (depth) guard[depth] = 0; next }
        if (text ~ /^[ \t]*#[ \t]*endif/) { if (depth) depth--; next }
        cudaonly = 0
        for (i = 1; i <= depth; i++) if (guard[i]) cudaonly = 1
        if (match(text, /<[^>]*>/)) {
            sys = substr(text, RSTART + 1, RLENGTH - 2)
            if (sys ~ /^(cuda|cublas|nccl|cooperative_groups|cub\/|mma\.h)/ && from != "cuda" && from != "runtime/gpu" && !cudaonly)
                why = "<" sys "> outside cuda/ and runtime/gpu/"
            else if (sys == "mpi.h" && file != "runtime/cpu/comm.c")
                why = "<mpi.h> outside runtime/cpu/comm.c"
            else next
        } else {
            if (!match(text, /"[^"]*"/)) next
            inc = substr(text, RSTART + 1, RLENGTH - 2)
            if (inc ~ /(^|\/)\.\.(\/|$)/) why = "\"" inc "\": include by path from the repository root, not with .."
            else {
                target = index(inc, "/") ? inc : dirname(file) "/" inc
                to = room(target)
                if (!(from in ok)) next
                if (index(ok[from], " " to " ") == 0 && index(ok[from], " " target " ") == 0)
                    why = from "/ may not include " target " (" to "/)"
                else if (basename(target) ~ /(_int\.h|_internal\.cuh|_impl\.h)$/ && dirname(target) != dirname(file))
                    why = target " is private to " dirname(target) "/"
                if (why == "") next
            }
        }
        if (sys == "" && (file " " target) in allowed) { delete unused[file " " target]; next }
        print file ":" line ": " why
        bad = 1
    }
    END {
        for (k in unused) print "check_includes: note: allowance \"" k "\" no longer needed: delete it from scripts/check_includes.sh"
        exit bad
    }'
}

root=.
self=1
while [ $# -gt 0 ]; do
    case $1 in
        --root) root=$2; shift 2 ;;
        --no-self-test) self=0; shift ;;
        *) echo "usage: $0 [--root DIR] [--no-self-test]" >&2; exit 2 ;;
    esac
done

passed=0; failed=0
if check "$root" "$ALLOW"; then
    passed=$((passed + 1))
else
    echo "FAIL: include layering of $root (above; README.md Layout, scripts/check_includes.sh)"
    failed=$((failed + 1))
fi

if [ "$self" = 1 ]; then
    tmp=$(mktemp -d) || exit 1
    trap 'rm -rf "$tmp"' EXIT
    # A clean tree with one file per room, each including what it may.
    plant_clean() {
        rm -rf "$tmp/t" && mkdir -p "$tmp/t"/{format,convert,cuda,runtime/{cpu,gpu,text,serve,cli}}
        local t=$tmp/t
        printf '#include "status.h"\n#include <stdio.h>\n' >"$t/format/quant.h"
        printf '#include "format/quant.h"\n#include "synth.h"\n' >"$t/convert/convert.c"
        printf '#include "format/quant.h"\n#include "format/status.h"\n#include <cuda_runtime.h>\n#include "cuda/cuk_internal.cuh"\n' >"$t/cuda/ops.cu"
        printf '#include "format/blob.h"\n#include "runtime/cpu/model_impl.h"\n' >"$t/runtime/cpu/model.c"
        printf '#include "format/gguf.h"\n' >"$t/runtime/text/chat.c"
        printf '#include "runtime/cpu/model.h"\n#include "cuda/cuk.h"\n#include <nccl.h>\n#include "runtime/gpu/gpu_int.h"\n' >"$t/runtime/gpu/gpu_model.c"
        printf '#include "runtime/gpu/gpu_model.h"\n#include "runtime/text/sample.h"\n' >"$t/runtime/engine.c"
        printf '#include "runtime/engine.h"\n' >"$t/runtime/serve/serve_api.c"
        printf '#include "runtime/serve/serve.h"\n#include "runtime/engine.h"\n' >"$t/runtime/cli/main_run.c"
        printf '#include <mpi.h>\n' >"$t/runtime/cpu/comm.c"
    }
    # case NAME FILE LINE: the clean tree plus LINE appended to FILE must fail the check.
    expect_fail() {
        plant_clean
        printf '%s\n' "$3" >>"$tmp/t/$2"
        if check "$tmp/t" "" >"$tmp/out" 2>&1; then
            echo "FAIL self-test $1: $2 with '$3' passed the check"; failed=$((failed + 1))
        elif ! grep -q "^$2:" "$tmp/out"; then
            echo "FAIL self-test $1: the check failed without naming $2:"; cat "$tmp/out"; failed=$((failed + 1))
        else
            passed=$((passed + 1))
        fi
    }
    plant_clean
    if check "$tmp/t" "" >"$tmp/out" 2>&1; then passed=$((passed + 1)); else
        echo "FAIL self-test clean tree:"; cat "$tmp/out"; failed=$((failed + 1))
    fi
    expect_fail format-up        format/quant.h        '#include "runtime/cpu/model.h"'
    expect_fail format-convert   format/quant.h        '#include "convert/convert.h"'
    expect_fail convert-runtime  convert/convert.c     '#include "runtime/cpu/weights.h"'
    expect_fail convert-cuda     convert/convert.c     '#include "cuda/cuk.h"'
    expect_fail cuda-blob        cuda/ops.cu           '#include "format/blob.h"'
    expect_fail cuda-runtime     cuda/ops.cu           '#include "runtime/gpu/gpu_model.h"'
    expect_fail cpu-gpu          runtime/cpu/model.c   '#include "runtime/gpu/gpu_model.h"'
    expect_fail cpu-text         runtime/cpu/model.c   '#include "runtime/text/tokenizer.h"'
    expect_fail cpu-cuda-header  runtime/cpu/model.c   '#include <cuda_runtime_api.h>'
    expect_fail text-cpu         runtime/text/chat.c   '#include "runtime/cpu/model.h"'
    expect_fail gpu-engine       runtime/gpu/gpu_model.c '#include "runtime/engine.h"'
    expect_fail gpu-serve        runtime/gpu/gpu_model.c '#include "runtime/serve/serve.h"'
    expect_fail gpu-private      runtime/gpu/gpu_model.c '#include "runtime/cpu/model_impl.h"'
    expect_fail engine-cuda      runtime/engine.c      '#include "cuda/cuk.h"'
    expect_fail engine-serve     runtime/engine.c      '#include "runtime/serve/serve.h"'
    expect_fail runtime-convert  runtime/serve/serve_api.c '#include "convert/shard.h"'
    expect_fail serve-cli        runtime/serve/serve_api.c '#include "runtime/cli/args.h"'
    expect_fail cli-convert      runtime/cli/main_run.c '#include "convert/convert.h"'
    expect_fail dotdot           runtime/cpu/model.c   '#include "../../format/quant.h"'
    expect_fail mpi-elsewhere    runtime/cpu/model.c   '#include <mpi.h>'
    expect_fail cuda-header-host format/quant.h        $'#ifdef __CUDACC__\n#else\n#include <cuda_fp16.h>\n#endif'
    expect_fail cuda-header-not  format/quant.h        $'#ifndef __CUDACC__\n#include <cuda_fp16.h>\n#endif'
    # a device-only branch may name a CUDA header outside cuda/ (format's decoders shared with it)
    plant_clean
    printf '#if defined(__CUDACC__)\n#include <cuda_fp16.h>\n#endif\n' >>"$tmp/t/format/quant.h"
    if check "$tmp/t" "" >"$tmp/out" 2>&1; then passed=$((passed + 1)); else
        echo "FAIL self-test nvcc-only branch:"; cat "$tmp/out"; failed=$((failed + 1))
    fi
    # An allowance lets exactly its edge through.
    plant_clean
    printf '#include "runtime/cpu/model_impl.h"\n' >>"$tmp/t/runtime/gpu/gpu_model.c"
    if check "$tmp/t" "runtime/gpu/gpu_model.c runtime/cpu/model_impl.h reason" >"$tmp/out" 2>&1; then
        passed=$((passed + 1))
    else
        echo "FAIL self-test allowance:"; cat "$tmp/out"; failed=$((failed + 1))
    fi
fi
echo "check_includes: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
