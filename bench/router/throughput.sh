#!/bin/sh
# Router throughput: tandem-router in front of colocated sim workers that take
# zero modelled time (--backend sim --time-scale 0), driven by wrk with short
# non-streaming completions (bench/router/completions.lua). What is measured
# is the router's own cost per request: HTTP parsing, JSON, tokenizing,
# hashing, the scheduling decision, the control-link round trip over NNG and
# the response. Results go to docs/performance.md ("## router"); the same
# load against nginx in the same run: vs_nginx.sh.
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
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster.sh"
rt_cluster_tmp router

command -v wrk >/dev/null || { echo "throughput.sh: wrk is not installed (deploy/install-deps.sh)" >&2; exit 1; }

pin_wrk=""
[ -n "${TASKSET_WRK:-}" ] && pin_wrk="taskset -c $TASKSET_WRK"

rt_cluster_start "$WORKERS"

echo "router http://127.0.0.1:$PORT, $WORKERS sim workers, wrk -t$THREADS -c$CONNS -d${DURATION}s"
# Warm-up (connections, allocator, prefix index), then the measured run.
$pin_wrk wrk -t"$THREADS" -c"$CONNS" -d2s -s "$HERE/completions.lua" \
	"http://127.0.0.1:$PORT/v1/completions" >/dev/null
$pin_wrk wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency -s "$HERE/completions.lua" \
	"http://127.0.0.1:$PORT/v1/completions"
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^tandem:router_requests_total|^tandem:routing_decision_seconds_(sum|count)' || true
