#!/usr/bin/env bash
# Runs each test program given on the command line from the repository root. Every program
# (or script: NAME is its file name without .sh) prints `NAME: N passed, M failed` as its last line; a program that crashes or exits non-zero
# without reporting counts as one failure. Prints the grand total last.
set -u
passed=0; failed=0
for t in "$@"; do
  name=$(basename "$t" .sh)
  out=$("$t" 2>&1); rc=$?
  summary=$(printf '%s\n' "$out" | grep -E "^$name: [0-9]+ passed, [0-9]+ failed$" | tail -1)
  if [ -z "$summary" ]; then
    printf '%s\n' "$out" | tail -30
    echo "$name: crashed or did not report (exit $rc)"
    failed=$((failed + 1)); continue
  fi
  p=$(echo "$summary" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
  f=$(echo "$summary" | sed -E 's/.* ([0-9]+) failed$/\1/')
  if [ "$f" -ne 0 ] || [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | grep -E "FAIL" | head -40
    [ "$f" -eq 0 ] && f=1
  fi
  echo "$summary"
  passed=$((passed + p)); failed=$((failed + f))
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
