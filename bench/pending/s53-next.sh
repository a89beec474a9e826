#!/usr/bin/env bash
# Session 53's prepared device call (bench/NOTES.md, session 53), carrying $BINS alone (default
# .dev/bins12: topkbench, scbench = bench/pending/topkbench.cu and scbench.cu built here against
# HEAD's cuda/indexer.cu; dec_h, dec_cmp, dec_tf32 = bench_decode of HEAD, of HEAD +
# s53-topk-cmp.patch and of HEAD + s53-scores-tf32.patch; t_graph_kernels = test_graph_kernels of
# the tf32 tree; all from bench/pending/s51-bins.sh):
#   bash bench/pending/s53-next.sh    # the t_* tests; topkbench (k_topk_cmp against k_topk_one, selections
#                                     # compared with k_topk's); scbench (TF32 scores and their
#                                     # fixed-cost ablations); bench_decode rounds at CTXS (default
#                                     # 32768 16384 1024 32768), the trees alternated; then ncu
#                                     # --set full of the first k_scores_mma<0> launch (1536 keys)
# QUICK=1 skips ncu. Writes at most four files to $OUT (the tool returns a bounded number).
set -u
cd "$(dirname "$0")/../.." || exit 2
BINS=${BINS:-.dev/bins12}
OUT=${OUT:-/tmp/s53}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd "$BINS" && for f in *.xz; do xz -dc "$f" >"/tmp/${f%.xz}" && chmod +x "/tmp/${f%.xz}"; done)
for f in "$BINS"/t_*.xz; do # test binaries of a patched tree
  [ -f "$f" ] || continue
  v=$(basename "${f%.xz}")
  timeout 200 "/tmp/$v" >"/tmp/$v.log" 2>&1
  echo "$v rc=$?: $(tail -1 "/tmp/$v.log")"
  grep -E "FAIL|tf32" "/tmp/$v.log" | head -12
  cat "/tmp/$v.log" >>"$OUT/bench.log"
done
for b in topkbench scbench; do
  [ -x "/tmp/$b" ] || continue
  timeout 120 "/tmp/$b" 200 >"/tmp/$b.log" 2>&1
  echo "$b rc=$?"
  grep -E "^\||FAIL|passed" "/tmp/$b.log" | grep -v -- "--- |"
  cat "/tmp/$b.log" >>"$OUT/bench.log"
done
DEC="--decode --layers 78 --steps 20 --modes fast --graph on"
for ctx in ${CTXS:-32768 16384 1024 32768}; do
  for f in "$BINS"/dec_*.xz; do
    v=$(basename "${f%.xz}")
    # shellcheck disable=SC2086 # DEC: several options
    timeout 150 "/tmp/$v" $DEC --ctx "$ctx" >"/tmp/$v.log" 2>&1
    echo "ctx $ctx $v rc=$?"
    grep -E '^decode ' "/tmp/$v.log" | sed 's/ median of.*RATIO/, ratio/; s/ (vs.*//' | tr -s ' '
    grep -E "(idx_topk|idx_scores|mla_attend)  " "/tmp/$v.log" | tr -s ' '
  done
done
if [ -x /tmp/scbench ] && [ "${QUICK:-0}" != 1 ]; then
  NCU=/usr/local/cuda/bin/ncu
  timeout 200 $NCU -o /tmp/sc -f -k regex:k_scores_mma --launch-count 1 --set full /tmp/scbench 3 >/tmp/ncu_run.log 2>&1
  echo "ncu rc=$?"
  timeout 60 $NCU --import /tmp/sc.ncu-rep --page details >"$OUT/ncu_sc.txt" 2>&1
  timeout 60 $NCU --import /tmp/sc.ncu-rep --page source --print-source sass --csv >"$OUT/ncu_sc.csv" 2>&1
  echo "import rc=$? $(wc -l <"$OUT/ncu_sc.txt") / $(wc -l <"$OUT/ncu_sc.csv") lines"
  grep -E "Duration|Elapsed Cycles|SM Active Cycles|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Eligible Warps" \
    "$OUT/ncu_sc.txt" | head -12
fi
