#!/usr/bin/env bash
# A CTest verdict by exit status and output together (PASS_REGULAR_EXPRESSION
# alone ignores the exit status: a program that printed "OK" and then crashed
# or returned 1 would pass).
# Usage: expect.sh EXIT_STATUS PASS_REGEX FAIL_REGEX -- COMMAND [ARGS...]
#   Runs COMMAND, shows its output, and passes only if it exits with
#   EXIT_STATUS, its output (stdout and stderr, as one text: '.' matches a
#   newline) matches the extended regex PASS_REGEX, and, when FAIL_REGEX is not
#   empty, does not match FAIL_REGEX.
set -uo pipefail
if [ $# -lt 5 ] || [ "$4" != "--" ]; then
  echo "usage: expect.sh EXIT_STATUS PASS_REGEX FAIL_REGEX -- COMMAND [ARGS...]" >&2
  exit 2
fi
want=$1 pass=$2 fail=$3
shift 4
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
got=$?
cat "$out"
verdict=0
if [ "$got" -ne "$want" ]; then
  echo "[expect] FAILED: exit status $got, expected $want" >&2
  verdict=1
fi
if ! grep -Ezq -- "$pass" "$out"; then
  echo "[expect] FAILED: the output does not match: $pass" >&2
  verdict=1
fi
if [ -n "$fail" ] && grep -Ezq -- "$fail" "$out"; then
  echo "[expect] FAILED: the output matches the failure pattern: $fail" >&2
  verdict=1
fi
exit $verdict
