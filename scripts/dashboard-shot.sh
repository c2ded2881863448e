#!/bin/sh
# docs/dashboard.png: the router's live page (GET /dashboard) of a busy
# 4-worker cluster, as headless Chromium draws it. Starts `tandem up` with
# two prefill and two decode tiny workers under prefix-aware P/D routing
# (deploy/routing/pd-prefix-precise.yaml), drives it with `tandem bench`
# (shared-prefix prompts, so prefix-cache hits and both P/D verdicts show),
# waits WARM seconds, takes the screenshot, stops everything.
#
#   scripts/dashboard-shot.sh [BIN_DIR] [OUT.png]
# Defaults: build-ci/bin (a RelWithDebInfo build: the tiny workers of a
# Debug build are too slow for a busy cluster), docs/dashboard.png.
# Environment: RATE (requests/s, 3), WARM (seconds before the shot, 25),
# WIDTH and HEIGHT (the window, 1500 x 1180), POLLS (the page's polls, 300).
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "${1:-$ROOT/build-ci/bin}" && pwd)
OUT=${2:-$ROOT/docs/dashboard.png}
RATE=${RATE:-3}
WARM=${WARM:-25}
WIDTH=${WIDTH:-1500}
HEIGHT=${HEIGHT:-1180}
POLLS=${POLLS:-300}
TMP=$(mktemp -d /tmp/tandem-dashboard-shot-XXXXXX)
UP_PID=""
BENCH_PID=""

cleanup() {
	if [ -n "$BENCH_PID" ]; then kill "$BENCH_PID" 2>/dev/null || true; wait "$BENCH_PID" 2>/dev/null || true; fi
	if [ -n "$UP_PID" ]; then kill -TERM "$UP_PID" 2>/dev/null || true; wait "$UP_PID" 2>/dev/null || true; fi
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v chromium >/dev/null || {
	echo "dashboard-shot.sh: chromium is not installed (deploy/install-deps.sh installs it)" >&2
	exit 1
}
[ -x "$BIN/tandem" ] || {
	echo "dashboard-shot.sh: no $BIN/tandem: build first (cmake --build build-ci) or name BIN_DIR" >&2
	exit 1
}

cat >"$TMP/cluster.yaml" <<YAML
name: dashboard-2p2d
model: tiny
backend: tiny
block_size: 16
log_level: warn
router:
  host: 127.0.0.1
ports:
  router: 0
transport:
  kind: ipc
routing: $ROOT/deploy/routing/pd-prefix-precise.yaml
pools:
  prefill:
    count: 2
    kv_blocks: 2048
    token_budget: 128
  decode:
    count: 2
    kv_blocks: 1024
    max_running: 64
YAML

(cd "$TMP" && exec "$BIN/tandem" up -c cluster.yaml) >"$TMP/up.out" 2>"$TMP/up.err" &
UP_PID=$!
i=0
until grep -q '^READY id=up' "$TMP/up.out" 2>/dev/null; do
	i=$((i + 1))
	if [ $i -gt 600 ] || ! kill -0 "$UP_PID" 2>/dev/null; then
		echo "dashboard-shot.sh: tandem up did not come up; its stderr:" >&2
		cat "$TMP/up.err" >&2
		exit 1
	fi
	sleep 0.1
done
PORT=$(sed -n 's/^READY id=up http=127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$TMP/up.out")

"$BIN/tandem" bench --base-url "http://127.0.0.1:$PORT" --dataset-name shared-prefix \
	--gsp-num-groups 32 --gsp-prompts-per-group 16 --gsp-system-prompt-len 256 \
	--gsp-question-len 32 --gsp-output-len 32 --request-rate "$RATE" --duration 600 \
	--disable-progress >"$TMP/bench.out" 2>&1 &
BENCH_PID=$!
sleep "$WARM"

# Under --virtual-time-budget a poll's 1 s wait takes no real time, so the
# page polls back to back: POLLS polls span some real seconds, over which
# the page (which dates samples by the router's clock) shows its rates and
# percentiles.
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
	--user-data-dir="$TMP/profile" --window-size="$WIDTH,$HEIGHT" \
	--virtual-time-budget="$((POLLS * 1000))" --screenshot="$TMP/shot.png" \
	"http://127.0.0.1:$PORT/dashboard" >"$TMP/chromium.out" 2>&1 || {
	echo "dashboard-shot.sh: chromium failed:" >&2
	cat "$TMP/chromium.out" >&2
	exit 1
}
cp "$TMP/shot.png" "$OUT"
echo "dashboard-shot.sh: $OUT (cluster at http://127.0.0.1:$PORT, $RATE req/s, after $WARM s)"
