#!/usr/bin/env bash
# Runs the tests that read the wall clock under shifted clocks (libfaketime, Debian package
# `faketime`): a Monday 07:59 and 08:01 around the weekly reports' default schedule, a Sunday
# 23:59 at the end of an ISO week, and both sides of a DST change (Europe/Berlin, also as TZ).
# The suite must pass at every one of them: no test may depend on the day or the hour.
#
#   tests/clock/run-shifted.sh [pytest args...]   (default: the clock-reading tests below)
#
# Only this Python process and its children are shifted; the test bed's servers (Go binaries,
# which read the clock without libc) keep real time, so the times chosen lie after the test
# bed's certificates were made (they are valid for a year). Not part of `make test`: each run
# of the selection takes minutes, and five of them would triple the suite. It starts the test
# bed (as `make testbed-up`) when none is running, and leaves it running.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=$(find /usr/lib -name libfaketime.so.1 2>/dev/null | head -1)
if [ -z "$lib" ]; then
  echo "libfaketime is not installed: apt-get install faketime" >&2
  exit 2
fi
if [ $# -eq 0 ]; then
  set -- tests/operator/test_operator_as_chart_sa.py tests/operator/test_operator_e2e.py \
    tests/operator/test_audit_kube.py tests/reports tests/policy tests/audit tests/cli tests/gate tests/kube tests/doctor -q -p no:cacheprovider
fi
# The test bed runs at real time: start it (or reuse the running one) before any clock moves,
# so that no certificate of it is made at a shifted time.
.venv/bin/python -m auditor.testbed up >/dev/null
year=$(date -u +%Y)
# the next Monday after today, and the next last-Sunday-of-March (DST starts at 01:00 UTC)
monday=$(date -u -d "next monday" +%F)
sunday=$(date -u -d "$monday -1 day" +%F)
dst=$(for y in "$year" $((year + 1)); do d=$(date -u -d "$y-03-31" +%F); while [ "$(date -u -d "$d" +%u)" != 7 ]; do d=$(date -u -d "$d -1 day" +%F); done; echo "$d"; done | while read -r d; do [ "$d" \> "$(date -u +%F)" ] && echo "$d" && break; done)
status=0
for at in "$monday 07:59:00|UTC" "$monday 08:01:00|UTC" "$sunday 23:59:00|UTC" "$dst 00:59:00|Europe/Berlin" "$dst 01:01:00|Europe/Berlin"; do
  when=${at%|*} tz=${at#*|}
  echo "=== clock at $when UTC (TZ=$tz)"
  local_when=$(TZ=$tz date -d "$when UTC" '+%F %T')  # libfaketime reads it in the process's TZ
  if ! TZ=$tz LD_PRELOAD=$lib FAKETIME="@$local_when" FAKETIME_DONT_RESET=1 .venv/bin/python -m pytest "$@"; then
    echo "=== FAILED at $when UTC (TZ=$tz)"
    status=1
  fi
done
exit $status
