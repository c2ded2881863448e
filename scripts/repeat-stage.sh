#!/bin/sh
# Runs one stage of deploy/test.sh N times in a row (default: tsan, 10) on the
# current build and stops at the first failure. Issue 12 asks the TSan stage to
# pass ten times in a row with CI's 3 jobs on 2 cores; the runs are recorded in
# docs/reliability.md ("## Sanitizers and valgrind in CI").
#
#   scripts/repeat-stage.sh [stage] [runs]     e.g. scripts/repeat-stage.sh tsan 10
#
# Prints one line per run (result and seconds); logs go to build-logs/repeat-<stage>-<i>.log.
# Exit status 0 when every run passed, 1 at the first failure.
set -eu
cd "$(dirname "$0")/.."
stage=${1:-tsan}
runs=${2:-10}
mkdir -p build-logs
i=1
while [ "$i" -le "$runs" ]; do
	t=$(date +%s)
	log=build-logs/repeat-$stage-$i.log
	if ./deploy/test.sh --stage "$stage" >"$log" 2>&1; then
		echo "run $i/$runs: $stage ok in $(($(date +%s) - t)) s"
	else
		echo "run $i/$runs: $stage FAILED in $(($(date +%s) - t)) s (log: $log)"
		grep -E "Failed|\*\*\*|FAILED" "$log" | head -20
		exit 1
	fi
	i=$((i + 1))
done
echo "$stage: $runs/$runs passed in a row ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ', with local changes'))"
