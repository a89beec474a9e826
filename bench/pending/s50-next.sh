#!/usr/bin/env bash
# Device calls of session 50 (bench/NOTES.md, session 50).
#   bash bench/pending/s50-next.sh bins    # carry .dev/bins6 (dec_b: HEAD with bench_decode's kv_b
#                                          # rebuilt; dec_n: + k_mla_dec's one-round combine and
#                                          # batched tile conversion; dec_q0: HEAD, kv_b random;
#                                          # dec_n2: + the partial tiles' skipped products
#                                          # (s50-mladec2.patch, on top of s50-mladec.patch);
#                                          # t_mla / t_mla2: test_mla_dec of
#                                          # dec_n / dec_n2; b_mla_b / _n / _n2: bench_mla_dec of
#                                          # the three kernels): s49-next.sh bins over them,
#                                          # bench_mla_dec twice each, then an nsys node trace of
#                                          # dec_n2's graph steps
#                                          # (where nsys is there) summarised by s50-nsys.py
#   bash bench/pending/s50-next.sh testab  # here first: git show HEAD:cuda/attn_dec.cu >
#                                          # .dev/attn_dec.head.cu; git apply the winner of
#                                          # s50-mladec.patch or it and then s50-mladec2.patch;
#                                          # carry gpu-deps, oracle-carry and .dev/attn_dec.head.cu:
#                                          # make test-gpu on the tree (run_device.sh, no converter
#                                          # bench), then its bench_decode against one rebuilt with
#                                          # HEAD's attn_dec.cu, two rounds at 1k (about 530 s)
set -u
cd "$(dirname "$0")/../.." || exit 2
DEC="--decode --layers 78 --steps 20 --modes fast --graph on --ctx 1024"
case "${1:-}" in
bins)
  BINS=.dev/bins6 CTX1=${CTX1:-1024,32768} bash bench/pending/s49-next.sh bins
  for r in 1 2; do # bench_mla_dec of HEAD's kernel and the patches': the kernel alone, graph-timed
    for v in b_mla_b b_mla_n b_mla_n2; do
      [ -f ".dev/bins6/$v.xz" ] || continue
      xz -dc ".dev/bins6/$v.xz" >"/tmp/$v" && chmod +x "/tmp/$v"
      timeout 60 "/tmp/$v" >"$OUT/$v.$r.log" 2>&1
      echo "round $r $v rc=$?: $(tail -1 "$OUT/$v.$r.log")"
      grep -E "^\| (8|64) \| 1 \|" "$OUT/$v.$r.log"
    done
  done
  # shellcheck disable=SC2012 # a path or none
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  echo "nsys: ${NSYS:-none}"
  [ -n "$NSYS" ] || exit 0
  timeout 200 "$NSYS" profile --cuda-graph-trace=node -t cuda --sample=none --cpuctxsw=none -o /tmp/ns -f true \
    /tmp/dec_n2 --decode --layers 78 --steps 5 --warmup 2 --modes fast --graph on --ctx 1024 >/tmp/ns.log 2>&1
  echo "nsys rc=$?"
  timeout 120 "$NSYS" stats -q -r cuda_gpu_trace -f csv -o /tmp/ns /tmp/ns.nsys-rep >/tmp/nss.log 2>&1
  echo "stats rc=$?"
  # shellcheck disable=SC2012
  f=$(ls /tmp/ns_cuda_gpu_trace*.csv 2>/dev/null | head -1)
  [ -n "$f" ] && python3 bench/pending/s50-nsys.py "$f" 20 | tee "$OUT/nsys.txt"
  [ -n "$f" ] && xz -c "$f" >"$OUT/trace.csv.xz"
  ;;
testab)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  GLM5_SHARED=$PWD/oracle-carry CONVERT_BENCH=0 timeout 420 bash tests/gpu/run_device.sh >"$OUT/rd.log" 2>&1
  echo "run_device rc=$?"
  grep -E "build rc|passed|FAIL" "$OUT/rd.log" | grep -v " 0 failed" | tail -20
  grep -E "^[0-9]+ passed" "$OUT/rd.log" | tail -1
  B=build/dev
  cp "$B/gpu/tests/bench_decode" /tmp/dec_n || exit 1
  cp .dev/attn_dec.head.cu cuda/attn_dec.cu || exit 1
  CC=$([ -x /opt/gcc/bin/gcc ] && echo /opt/gcc/bin/gcc || echo gcc)
  timeout 120 make -j"$(nproc)" CC="$CC" BUILD=$B EXTRA_CFLAGS="-isystem gpu-deps/include -Wno-error" \
    EXTRA_LDFLAGS="-Lgpu-deps/lib" "$B/gpu/tests/bench_decode" >/tmp/bb.log 2>&1 || { tail -5 /tmp/bb.log; exit 1; }
  cp "$B/gpu/tests/bench_decode" /tmp/dec_b
  for r in 1 2; do
    for v in dec_b dec_n; do
      # shellcheck disable=SC2086 # DEC: several options
      timeout 60 "/tmp/$v" $DEC >"/tmp/$v.$r.log" 2>&1
      echo "round $r $v rc=$?"
      grep -E '^decode |^kv_b' "/tmp/$v.$r.log" | sed 's/ median of.*RATIO/, ratio/; s/ (vs.*//' | tr -s ' '
      grep -E "mla_attend  " "/tmp/$v.$r.log" | head -1 | tr -s ' '
    done
  done
  cp /tmp/dec_n.1.log "$OUT/dec_n.log"
  ;;
*) echo "usage: $0 bins|testab" >&2; exit 2 ;;
esac
