#!/bin/sh
# Fuzzes every libFuzzer harness in fuzz/ for N seconds each (default 300),
# one after the other, and prints one line of figures per harness.
#
#   scripts/fuzz.sh [seconds] [harness...]      e.g. scripts/fuzz.sh 300
#                                                    scripts/fuzz.sh 60 http wire
#
# Builds (or refreshes) the clang fuzz build in $TANDEM_FUZZ_BUILD (default
# build-fuzz). Each harness starts from its committed corpus
# (fuzz/corpus/<name>/, read only) plus a scratch corpus that keeps what
# earlier runs found (<build>/fuzz/corpus/<name>/). Logs go to
# <build>/fuzz/logs/<name>.log; a crashing input is saved as
# <build>/fuzz/<name>-crash-<sha1> and the script exits 1 after the last
# harness. Figures are recorded in docs/reliability.md "## Bad input".
set -eu
cd "$(dirname "$0")/.."
secs=${1:-300}
[ $# -gt 0 ] && shift
build=${TANDEM_FUZZ_BUILD:-build-fuzz}
all="http openai wire kvframe routing_yaml cluster_yaml checkpoint tokenizer"
names=${*:-$all}

CC=${CC:-clang} cmake -S . -B "$build" -DTANDEM_FUZZ=ON -DTANDEM_BUILD_TESTS=OFF \
	-DTANDEM_BUILD_BENCH=OFF -DTANDEM_WERROR=ON >/dev/null
targets=$(for n in $names; do printf 'fuzz_%s ' "$n"; done)
# shellcheck disable=SC2086 # one word per target
cmake --build "$build" -j"$(nproc)" --target $targets >/dev/null
mkdir -p "$build/fuzz/logs"

failed=0
printf '%-14s %10s %8s %6s %6s %7s %s\n' harness execs exec/s cov ft corpus result
for n in $names; do
	bin="$build/fuzz/fuzz_$n"
	[ -x "$bin" ] || { echo "fuzz.sh: no harness $n (have: $all)" >&2; exit 2; }
	log="$build/fuzz/logs/$n.log"
	mkdir -p "$build/fuzz/corpus/$n"
	# -close_fd_mask=2: the loaders' log lines cost nothing; libFuzzer and
	# the sanitizers report on a copy of stderr.
	if "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -close_fd_mask=2 \
		-print_final_stats=1 -artifact_prefix="$build/fuzz/$n-" \
		"$build/fuzz/corpus/$n" "fuzz/corpus/$n" >"$log" 2>&1; then
		result=ok
	else
		result="CRASH (see $log)"
		failed=1
	fi
	# The last status line: "#123 DONE cov: 456 ft: 789 corp: 12/3456b ... exec/s: 99 ..."
	line=$(grep -E '^#[0-9]+' "$log" | tail -1)
	execs=$(echo "$line" | sed -n 's/^#\([0-9]*\).*/\1/p')
	eps=$(echo "$line" | sed -n 's/.*exec\/s: \([0-9]*\).*/\1/p')
	cov=$(echo "$line" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
	ft=$(echo "$line" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
	corp=$(echo "$line" | sed -n 's/.*corp: \([0-9]*\).*/\1/p')
	printf '%-14s %10s %8s %6s %6s %7s %s\n' "$n" "${execs:-?}" "${eps:-?}" "${cov:-?}" \
		"${ft:-?}" "${corp:-?}" "$result"
done
exit $failed
