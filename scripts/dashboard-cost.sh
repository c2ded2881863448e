#!/bin/sh
# What one poll of the router's live page (GET /dashboard) costs with many
# workers under a high decision rate: the page is made to keep up with 64
# workers and 1,000 decisions/s. Starts tandem-router with WORKERS colocated
# sim workers that take no modelled time (--backend sim --time-scale 0),
# drives RATE requests/s with `tandem bench` (short random prompts, 4
# tokens), and meanwhile measures
#   - the three bodies one poll reads (GET /v1/cluster,
#     /v1/decisions?limit=20&candidates=3, /metrics): bytes and curl's time;
#   - the browser's CPU per poll: headless Chromium runs the page for FEW
#     and for MANY polls (--virtual-time-budget; the shell's `times` gives
#     the CPU of the browser and its helper processes), and the difference
#     divided by MANY - FEW is the cost of one poll: fetch, JSON and
#     Prometheus parsing, drawing, layout;
#   - the decision rate the router reached (/v1/cluster decisions.total).
# Results go to docs/performance.md ("## Dashboard").
#
#   scripts/dashboard-cost.sh [BIN_DIR]       (default build-ci/bin)
# Environment: WORKERS (64), RATE (1000), FEW (10), MANY (110), REPEAT (3).
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "${1:-$ROOT/build-ci/bin}" && pwd)
WORKERS=${WORKERS:-64}
RATE=${RATE:-1000}
FEW=${FEW:-10}
MANY=${MANY:-110}
REPEAT=${REPEAT:-3}
MODEL=llama-3-8b
TMP=$(mktemp -d /tmp/tandem-dashboard-cost-XXXXXX)
PIDS=""

cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	[ -n "${KEEP:-}" ] && echo "kept $TMP" >&2 || rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for c in chromium curl; do
	command -v $c >/dev/null || { echo "dashboard-cost.sh: $c is not installed (deploy/install-deps.sh)" >&2; exit 1; }
done

# The router and its workers: bench/router/cluster.sh (room for the decision rate).
# shellcheck source=../bench/router/cluster.sh
. "$ROOT/bench/router/cluster.sh"
ROUTER_FLAGS="--max-pending 65536 --max-connections 16384" rt_cluster_start "$WORKERS"
URL="http://127.0.0.1:$PORT"

"$BIN/tandem" bench --base-url "$URL" --dataset-name random --random-input-len 64 \
	--random-output-len 4 --request-rate "$RATE" --duration 600 --disable-progress \
	>"$TMP/bench.out" 2>&1 &
BENCH=$!
PIDS="$BENCH $PIDS"
sleep 5

total() { curl -s --max-time 20 "$URL/v1/cluster" | sed -n 's/.*"decisions":{"total":\([0-9]*\).*/\1/p'; }

# CPU seconds (user + system) of Chromium running the page for $1 polls.
browser_cpu() {
	(
		chromium --headless --no-sandbox --disable-gpu --no-first-run \
			--user-data-dir="$TMP/profile-$1" --virtual-time-budget="$(($1 * 1000))" \
			--dump-dom "$URL/dashboard" >"$TMP/dom-$1.html" 2>/dev/null
		times
	) | tail -n 1 | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); n += a[1] * 60 + a[2] } printf "%.3f\n", n }'
}

d0=$(total)
t0=$(date +%s)
echo "router $URL: $WORKERS sim workers, tandem bench at $RATE req/s"
for path in /v1/cluster "/v1/decisions?limit=20&candidates=3" /metrics; do
	curl -s -o /dev/null -w "  GET $path: %{size_download} bytes in %{time_total} s\n" "$URL$path"
done
r=0
while [ $r -lt "$REPEAT" ]; do
	few=$(browser_cpu "$FEW")
	many=$(browser_cpu "$MANY")
	polls=$(sed -n 's/.*data-polls="\([0-9]*\)".*/\1/p' "$TMP/dom-$MANY.html")
	bytes=$(sed -n 's/.*data-bytes-mean="\([0-9]*\)".*/\1/p' "$TMP/dom-$MANY.html")
	workers=$(grep -o '<tr data-worker="[a-z0-9]' "$TMP/dom-$MANY.html" | wc -l)
	echo "$few $many $FEW $MANY $polls $bytes $workers" | awk '{
		printf "  browser: %d polls %.2f s CPU, %d polls %.2f s CPU: %.1f ms CPU per poll; %d polls done, %.0f kB per poll, %d workers drawn\n",
			$3, $1, $4, $2, ($2 - $1) / ($4 - $3) * 1000, $5, $6 / 1000, $7 }'
	r=$((r + 1))
done
d1=$(total)
t1=$(date +%s)
if [ -n "$d0" ] && [ -n "$d1" ] && [ "$t1" -gt "$t0" ]; then
	echo "  decisions: $((d1 - d0)) in $((t1 - t0)) s: $(((d1 - d0) / (t1 - t0)))/s"
else
	echo "  decisions: the router did not answer /v1/cluster (overloaded?)"
fi
echo "  load average: $(cut -d' ' -f1-3 /proc/loadavg)"
