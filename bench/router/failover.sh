#!/bin/sh
# How fast the router notices and recovers from faults, on this machine: the
# router's fault tests measure each of these and print it (they assert only
# that it happens), so this runs them N times and reports min / median / max:
#   disconnect  a streaming client goes away: until no worker holds a KV block
#   restart     a new router on the same announce address: until all 4 workers
#               are back (they announce every second)
#   sigstop     a stopped worker: until it is unhealthy (--heartbeat-timeout-ms 2000)
#   sigkill     a killed worker: until it is unhealthy (its link drops)
#   deadline    a generation past --deadline-ms 700: until the client has its 504
#   408         a request that never ends, --request-timeout-ms 500: until the 408
# Figures go to docs/performance.md ("router: failover").
#
# usage: bench/router/failover.sh [build dir, default build] [runs, default 10]
set -eu
build=${1:-build}
runs=${2:-10}
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "$build" && pwd)/bin
tests=$(cd "$build" && pwd)/tests
out=$(mktemp)
trap 'rm -f "$out"' EXIT
i=0
while [ "$i" -lt "$runs" ]; do
	TANDEM_BIN_DIR=$bin TANDEM_SOURCE_DIR=$src "$tests/test_int_router_faults" >>"$out" 2>&1 ||
		echo "run $i: test_int_router_faults failed" >&2
	TANDEM_BIN_DIR=$bin TANDEM_SOURCE_DIR=$src "$tests/test_int_router_http" >>"$out" 2>&1 ||
		echo "run $i: test_int_router_http failed" >&2
	i=$((i + 1))
done
# name, then the awk program that prints one figure per matching line.
summary() {
	awk "$2" "$out" | sort -n | awk -v name="$1" '
		{ v[NR] = $1 }
		END {
			if (NR == 0) { printf "%-11s no figures\n", name; exit }
			printf "%-11s n=%-3d min %6.0f  median %6.0f  max %6.0f ms\n", name, NR, v[1],
				v[int((NR + 1) / 2)], v[NR]
		}'
}
summary disconnect '/blocks released .* ms after the disconnect/ { print $3 }'
summary restart '/workers back .* ms after the new router started/ { print $4 }'
summary sigstop '/stopped worker unhealthy after/ { print $5 }'
summary sigkill '/killed worker unhealthy after/ { print $5 }'
summary deadline '/504 after .* ms \(deadline/ { print $3 }'
summary 408 '/408 after .* ms \(request timeout/ { print $3 }'
