#!/usr/bin/env bash
# Runs each test program given on the command line from the repository root. Every program
# (or script: NAME is its file name without .sh) prints `NAME: N passed, M failed` as its last line; a program that crashes or exits non-zero
# without reporting counts as one failure. Prints the grand total last.
# TEST_JOBS=N (default 1) runs up to N programs at once (make test-gpu TEST_JOBS=8: the GPU
# programs side by side on one device); the report keeps the command line's order either way.
set -u
passed=0; failed=0
jobs_max=${TEST_JOBS:-1}
case $jobs_max in ''|*[!0-9]*|0) echo "run_tests.sh: TEST_JOBS=$jobs_max is not a positive number"; exit 2 ;; esac
dir=$(mktemp -d /tmp/g5tests.XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
i=0
for t in "$@"; do
  i=$((i + 1))
  ( "$t" >"$dir/$i.out" 2>&1; echo $? >"$dir/$i.rc" ) &
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
done
wait
i=0
for t in "$@"; do
  i=$((i + 1))
  name=$(basename "$t" .sh)
  out=$(cat "$dir/$i.out"); rc=$(cat "$dir/$i.rc" 2>/dev/null || echo 1)
  summary=$(printf '%s\n' "$out" | grep -E "^$name: [0-9]+ passed, [0-9]+ failed$" | tail -1)
  if [ -z "$summary" ]; then
    printf '%s\n' "$out" | tail -30
    echo "$name: crashed or did not report (exit $rc)"
    failed=$((failed + 1)); continue
  fi
  p=$(echo "$summary" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
  f=$(echo "$summary" | sed -E 's/.* ([0-9]+) failed$/\1/')
  if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ]; then
    printf '%s\n' "$out" | grep -E "FAIL" | head -40
    [ "$f" -eq 0 ] && f=1
  fi
  echo "$summary"
  passed=$((passed + p)); failed=$((failed + f))
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
