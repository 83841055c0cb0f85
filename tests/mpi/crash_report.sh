#!/usr/bin/env bash
# A rank that calls a null function pointer dies by SIGSEGV and its report names the rank, the
# pc 0 and the calling function (the word at the stack pointer).
# usage: crash_report.sh MPIEXEC PROBE WORKDIR
set -uo pipefail
mpiexec=$1 probe=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$mpiexec" --allow-run-as-root --oversubscribe -np 1 "$probe" >"$work/out" 2>"$work/err"
rc=$?
fails=0
want() { grep -qF -- "$1" "$work/err" || { echo "FAIL: no line with: $1"; fails=$((fails + 1)); }; }
want "] fatal signal 11 (SIGSEGV)"
want "fault address 0x0"
want "pc 0x0 (not in a loaded object)"
want "word at sp (the caller, if pc is 0) "
grep -F "word at sp" "$work/err" | grep -qF "meshtrain_crash_probe_caller" ||
  { echo "FAIL: the caller is not named"; fails=$((fails + 1)); }
grep -q "^\[rank 0 " "$work/err" || { echo "FAIL: lines do not name the rank"; fails=$((fails + 1)); }
[ "$rc" -ne 0 ] || { echo "FAIL: exit status 0"; fails=$((fails + 1)); }
grep -q unreachable "$work/out" && { echo "FAIL: the probe went on after the crash"; fails=$((fails + 1)); }
if [ "$fails" -ne 0 ]; then sed 's/^/    /' "$work/err"; exit 1; fi
echo "ok: exit $rc; $(grep -F 'word at sp' "$work/err")"
