#!/bin/sh
# Streamed-token path: CPU of tandem-router and of `tandem bench` per streamed
# token. Starts the router and WORKERS colocated sim workers (Llama-3-8B,
# --time-scale 1: steps last their modelled time), runs `tandem bench` with
# streaming at RATE req/s, OUT output tokens each (one SSE chunk per token),
# and reads both processes' CPU time (utime + stime, /proc/PID/stat) around
# the run. Prints one line:
#   tokens=N wall_s=X tok_s=X router_us_tok=X bench_us_tok=X ttft_p50=X ttft_p99=X failed=N load=X
# Results go to docs/performance.md ("## Streamed-token path").
#
#   bench/router/stream.sh [build/bin] [ROUTER_BIN] [BENCH_BIN]
# ROUTER_BIN / BENCH_BIN run other binaries for the router or the load
# generator (old against new in the same minute); workers are always from
# build/bin.
# Environment: WORKERS (16), RATE (120), PROMPTS (RATE*10), IN (128), OUT (128),
# WARMUP (16 warm-up requests), INTERVAL (the workers' --stream-interval, 1),
# PERF_ROUTER / PERF_BENCH (a file: record that
# process with perf record -g -e cpu-clock into it).
#
# Note: on a 2-core machine the workers, the router and the load generator
# share the cores; the workers' CPU is not counted.
set -eu

BIN=${1:-build/bin}
ROUTER=${2:-$BIN/tandem-router}
BENCH=${3:-$BIN/tandem}
WORKERS=${WORKERS:-16}
RATE=${RATE:-120}
PROMPTS=${PROMPTS:-$((RATE * 10))}
IN=${IN:-128}
OUT=${OUT:-128}
WARMUP=${WARMUP:-16}
WFLAGS=""
[ "${INTERVAL:-1}" -gt 1 ] && WFLAGS="--stream-interval $INTERVAL"
. "$(cd "$(dirname "$0")" && pwd)/cluster.sh"
rt_cluster_tmp stream

# utime + stime of PID in clock ticks.
cpu_ticks() {
	awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

ROUTER_BIN=$ROUTER TIME_SCALE=1 WORKER_FLAGS=$WFLAGS
rt_cluster_start "$WORKERS"
RPID=$ROUTER_PID

set -- bench --base-url "http://127.0.0.1:$PORT" --model "$MODEL" --dataset-name random \
	--random-input-len "$IN" --random-output-len "$OUT" --ignore-eos
"$BENCH" "$@" --num-prompts "$WARMUP" --request-rate inf >/dev/null

if [ -n "${PERF_ROUTER:-}" ]; then
	perf record -g -e cpu-clock -o "$PERF_ROUTER" -p "$RPID" >/dev/null 2>&1 &
	PERFPID=$!
	PIDS="$PERFPID $PIDS"
	sleep 0.5
fi
r0=$(cpu_ticks "$RPID")
t0=$(date +%s.%N)
if [ -n "${PERF_BENCH:-}" ]; then
	perf record -g -e cpu-clock -o "$PERF_BENCH" \
		/usr/bin/time -f "%U %S" -o "$TMP/bench.time" \
		"$BENCH" "$@" --num-prompts "$PROMPTS" --request-rate "$RATE" >"$TMP/bench.out" 2>"$TMP/bench.err"
else
	/usr/bin/time -f "%U %S" -o "$TMP/bench.time" \
		"$BENCH" "$@" --num-prompts "$PROMPTS" --request-rate "$RATE" >"$TMP/bench.out" 2>"$TMP/bench.err"
fi
t1=$(date +%s.%N)
r1=$(cpu_ticks "$RPID")
if [ -n "${PERF_ROUTER:-}" ]; then
	kill -INT "$PERFPID"
	wait "$PERFPID" 2>/dev/null || true
fi
load=$(cut -d' ' -f1 /proc/loadavg)
hz=$(getconf CLK_TCK)
awk -v r0="$r0" -v r1="$r1" -v hz="$hz" -v t0="$t0" -v t1="$t1" -v la="$load" \
	-v bt="$(cat "$TMP/bench.time" | tail -n 1)" '
/^Total generated tokens:/ { tok = $NF }
/^Failed requests:/ { failed = $NF }
/^Median TTFT \(ms\):/ { p50 = $NF }
/^P99 TTFT \(ms\):/ { p99 = $NF }
/^Benchmark duration \(s\):/ { dur = $NF }
END {
	split(bt, b, " ")
	if (tok == 0) { print "stream.sh: no tokens streamed" > "/dev/stderr"; exit 1 }
	printf "tokens=%d wall_s=%.2f tok_s=%.0f router_us_tok=%.2f bench_us_tok=%.2f ttft_p50=%s ttft_p99=%s failed=%s load=%s\n",
		tok, dur, tok / dur, (r1 - r0) / hz * 1e6 / tok, (b[1] + b[2]) * 1e6 / tok,
		p50, p99, failed, la
}' "$TMP/bench.out"
