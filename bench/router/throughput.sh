#!/bin/sh
# Router throughput: tandem-router in front of colocated sim workers that take
# zero modelled time (--backend sim --time-scale 0), driven by wrk with short
# non-streaming completions (bench/router/completions.lua). What is measured
# is the router's own cost per request: HTTP parsing, JSON, tokenizing,
# hashing, the scheduling decision, the control-link round trip over NNG and
# the response. Results go to docs/performance.md ("## router").
#
#   bench/router/throughput.sh [build/bin]
# Environment: WORKERS (2), CONNS (64), THREADS (1), DURATION (10 s),
# ROUTING (an EndpointPickerConfig file; default: the router's embedded one),
# WRK_BODY (the request body), TASKSET_ROUTER / TASKSET_WRK (cpu lists for
# taskset, e.g. 0 and 1; empty: no pinning).
#
# Note: on a 2-core machine wrk, the router and the workers share the cores.
set -eu

BIN=${1:-build/bin}
WORKERS=${WORKERS:-2}
CONNS=${CONNS:-64}
THREADS=${THREADS:-1}
DURATION=${DURATION:-10}
MODEL=llama-3-8b
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d /tmp/tandem-bench-router-XXXXXX)
PIDS=""

cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

command -v wrk >/dev/null || { echo "throughput.sh: wrk is not installed (deploy/install-deps.sh)" >&2; exit 1; }

pin_router=""
[ -n "${TASKSET_ROUTER:-}" ] && pin_router="taskset -c $TASKSET_ROUTER"
pin_wrk=""
[ -n "${TASKSET_WRK:-}" ] && pin_wrk="taskset -c $TASKSET_WRK"

ANN="ipc://$TMP/announce.ipc"
set -- --port 0 --announce "$ANN" --model "$MODEL" --log-level warn
[ -n "${ROUTING:-}" ] && set -- "$@" --routing "$ROUTING"
$pin_router "$BIN/tandem-router" "$@" >"$TMP/router.out" 2>"$TMP/router.err" &
PIDS="$PIDS $!"
i=0
while ! grep -q READY "$TMP/router.out" 2>/dev/null; do
	i=$((i + 1)); [ $i -gt 100 ] && { cat "$TMP/router.err" >&2; exit 1; }
	sleep 0.05
done
PORT=$(sed -n 's/.*http=[^ ]*:\([0-9]*\) .*/\1/p' "$TMP/router.out")

w=0
while [ $w -lt "$WORKERS" ]; do
	"$BIN/tandem-decode" --colocated --backend sim --model "$MODEL" --time-scale 0 \
		--max-running 512 --max-waiting 4096 --router "$ANN" --log-level warn \
		>"$TMP/w$w.out" 2>"$TMP/w$w.err" &
	PIDS="$PIDS $!"
	w=$((w + 1))
done
i=0
until curl -s "http://127.0.0.1:$PORT/health" | grep -q "\"healthy_endpoints\":$WORKERS}"; do
	i=$((i + 1)); [ $i -gt 200 ] && { echo "workers did not register" >&2; exit 1; }
	sleep 0.05
done

echo "router http://127.0.0.1:$PORT, $WORKERS sim workers, wrk -t$THREADS -c$CONNS -d${DURATION}s"
# Warm-up (connections, allocator, prefix index), then the measured run.
$pin_wrk wrk -t"$THREADS" -c"$CONNS" -d2s -s "$HERE/completions.lua" \
	"http://127.0.0.1:$PORT/v1/completions" >/dev/null
$pin_wrk wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency -s "$HERE/completions.lua" \
	"http://127.0.0.1:$PORT/v1/completions"
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^tandem:router_requests_total|^tandem:routing_decision_seconds_(sum|count)' || true
