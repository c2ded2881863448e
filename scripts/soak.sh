#!/usr/bin/env bash
# Soak test (run by hand; results in docs/reliability.md, "## Soak"):
# `tandem bench` against a `tandem up` cluster for --duration seconds while a
# random worker is killed with SIGKILL every --kill-min..--kill-max seconds
# (tandem up restarts it). Then it reports:
#   - requests lost: sent but hung (bench timeout), closed without an answer,
#     or with no record at all. Must be 0: every other request either
#     succeeded or failed with a reason the client saw (an HTTP status);
#   - resident memory (VmRSS from /proc, every --sample seconds) of every
#     process over time, per process incarnation: must be flat;
#   - KV block accounting at the end, from each worker's /metrics:
#     free + used + cached_idle == total, and used == 0 once idle.
# Exit status 0 when all three hold, 1 otherwise, 2 on a usage error.
#
#   scripts/soak.sh                       # 30 minutes, tiny 2P+2D cluster
#   scripts/soak.sh --duration 120 --kill-min 10 --kill-max 20
#
# Everything runs under nice (the machine may be shared). Output directory:
# --out (default soak-<timestamp>): up.log, run/ (tandem up's logs),
# bench.log, summary.json, requests.jsonl, kills.csv, rss.csv, kv.txt,
# report.txt.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=1800
BIN="$ROOT/build/bin"
CLUSTER="$ROOT/deploy/clusters/tiny-2p2d.yaml"
RATE=1.5
CONC=16
IN_LEN=256
OUT_LEN=64
KILL_MIN=30
KILL_MAX=90
SAMPLE=10
TIMEOUT=120
NICE=10
SEED=$((RANDOM * 32768 + RANDOM))
OUT=""

usage() {
	cat <<EOF
usage: scripts/soak.sh [flags]
  --duration S     seconds of load (default $DURATION)
  --bin-dir DIR    where tandem, tandem-router, tandem-prefill, tandem-decode are (default $BIN)
  --cluster FILE   cluster file for tandem up (default deploy/clusters/tiny-2p2d.yaml)
  --rate R         requests per second, Poisson (default $RATE)
  --concurrency N  most requests in flight (default $CONC)
  --input-len N    prompt tokens (+-50%, default $IN_LEN)
  --output-len N   output tokens (ignore_eos, default $OUT_LEN)
  --kill-min S     shortest gap between kills (default $KILL_MIN)
  --kill-max S     longest gap between kills (default $KILL_MAX)
  --sample S       memory sampling period (default $SAMPLE)
  --timeout S      a request still running after S seconds counts as hung (default $TIMEOUT)
  --nice N         niceness of every process (default $NICE)
  --seed N         seed of the workload and of the kills (default: random, printed)
  --out DIR        output directory (default soak-<timestamp>)
EOF
}

while [ $# -gt 0 ]; do
	case "$1" in
	--duration) DURATION=$2 ;;
	--bin-dir) BIN=$2 ;;
	--cluster) CLUSTER=$2 ;;
	--rate) RATE=$2 ;;
	--concurrency) CONC=$2 ;;
	--input-len) IN_LEN=$2 ;;
	--output-len) OUT_LEN=$2 ;;
	--kill-min) KILL_MIN=$2 ;;
	--kill-max) KILL_MAX=$2 ;;
	--sample) SAMPLE=$2 ;;
	--timeout) TIMEOUT=$2 ;;
	--nice) NICE=$2 ;;
	--seed) SEED=$2 ;;
	--out) OUT=$2 ;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		echo "soak.sh: unknown flag $1 (see --help)" >&2
		exit 2
		;;
	esac
	if [ $# -lt 2 ]; then
		echo "soak.sh: $1 needs a value" >&2
		exit 2
	fi
	shift 2
done
for v in DURATION CONC IN_LEN OUT_LEN KILL_MIN KILL_MAX SAMPLE TIMEOUT SEED; do
	case "${!v}" in
	'' | *[!0-9]*)
		echo "soak.sh: $v must be a non-negative integer, got '${!v}'" >&2
		exit 2
		;;
	esac
done
if [ "$KILL_MAX" -lt "$KILL_MIN" ] || [ "$KILL_MIN" -lt 1 ]; then
	echo "soak.sh: need 1 <= --kill-min <= --kill-max" >&2
	exit 2
fi
for b in tandem tandem-router tandem-prefill tandem-decode; do
	if [ ! -x "$BIN/$b" ]; then
		echo "soak.sh: $BIN/$b not found (build first, or --bin-dir)" >&2
		exit 2
	fi
done
[ -n "$OUT" ] || OUT="soak-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

T0=$(date +%s)
now() { echo $(($(date +%s) - T0)); }
log() { echo "[soak $(now)s] $*" | tee -a "$OUT/soak.log"; }

UP_PID="" BENCH_PID="" KILLER_PID="" SAMPLER_PID=""
cleanup() {
	for p in $KILLER_PID $SAMPLER_PID $BENCH_PID; do
		kill "$p" 2>/dev/null || true
	done
	if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
		kill -TERM "$UP_PID" 2>/dev/null || true
		for _ in $(seq 1 100); do
			kill -0 "$UP_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$UP_PID" 2>/dev/null || true
	fi
	wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "seed $SEED, duration ${DURATION}s, rate $RATE/s, concurrency $CONC, kill every ${KILL_MIN}-${KILL_MAX}s, out $OUT"

# ---- The cluster ---------------------------------------------------------
nice -n "$NICE" "$BIN/tandem" up -c "$CLUSTER" --port 0 --run-dir "$OUT/run" >"$OUT/up.log" 2>&1 &
UP_PID=$!
PORT=""
for _ in $(seq 1 900); do
	PORT=$(sed -n 's/^READY id=up http=[^ ]*:\([0-9]*\) .*/\1/p' "$OUT/up.log" | head -1)
	[ -n "$PORT" ] && break
	if ! kill -0 "$UP_PID" 2>/dev/null; then
		break
	fi
	sleep 0.1
done
if [ -z "$PORT" ]; then
	log "tandem up did not become ready; last lines of up.log:"
	tail -20 "$OUT/up.log" >&2
	exit 1
fi
log "cluster up: tandem up pid $UP_PID, router http://127.0.0.1:$PORT"

# name of a tandem up child from its command line: the router, or --id NAME
proc_name() {
	local args
	args=$({ tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null) || return 1
	case "$args" in
	*tandem-router*) echo router ;;
	*--id\ *) sed 's/.*--id \([^ ]*\).*/\1/' <<<"$args" ;;
	*) return 1 ;;
	esac
}

children() { ps -o pid= --ppid "$UP_PID" 2>/dev/null | tr -d ' '; }

# ---- Memory sampler ------------------------------------------------------
echo "t_s,name,pid,rss_kb" >"$OUT/rss.csv"
sampler() {
	while :; do
		local t pid name rss
		t=$(now)
		for pid in $(children) "$UP_PID" ${BENCH_PID:-}; do
			if [ "$pid" = "$UP_PID" ]; then
				name=up
			elif [ "$pid" = "${BENCH_PID:-}" ]; then
				name=bench
			else
				name=$(proc_name "$pid") || continue
			fi
			rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
			[ -n "$rss" ] && echo "$t,$name,$pid,$rss" >>"$OUT/rss.csv"
		done
		sleep "$SAMPLE"
	done
}

# ---- Load ----------------------------------------------------------------
nice -n "$NICE" "$BIN/tandem" bench --port "$PORT" --duration "$DURATION" \
	--request-rate "$RATE" --max-concurrency "$CONC" \
	--random-input-len "$IN_LEN" --random-range-ratio 0.5 --random-output-len "$OUT_LEN" \
	--request-timeout "$TIMEOUT" --seed "$SEED" --disable-progress \
	--json "$OUT/summary.json" --save-requests "$OUT/requests.jsonl" >"$OUT/bench.log" 2>&1 &
BENCH_PID=$!
sampler &
SAMPLER_PID=$!
log "bench pid $BENCH_PID"

# ---- Killer --------------------------------------------------------------
echo "t_s,name,pid" >"$OUT/kills.csv"
killer() {
	RANDOM=$SEED
	local end=$((DURATION - 5))
	while :; do
		local gap=$((KILL_MIN + RANDOM % (KILL_MAX - KILL_MIN + 1)))
		if [ $(($(now) + gap)) -ge "$end" ]; then
			return
		fi
		sleep "$gap"
		local pids=() names=() pid name
		for pid in $(children); do
			name=$(proc_name "$pid") || continue
			case "$name" in
			router) ;;
			*)
				pids+=("$pid")
				names+=("$name")
				;;
			esac
		done
		[ ${#pids[@]} -gt 0 ] || continue
		local i=$((RANDOM % ${#pids[@]}))
		if kill -KILL "${pids[$i]}" 2>/dev/null; then
			echo "$(now),${names[$i]},${pids[$i]}" >>"$OUT/kills.csv"
			log "killed ${names[$i]} (pid ${pids[$i]})"
		fi
	done
}
killer &
KILLER_PID=$!

set +e
wait "$BENCH_PID"
BENCH_RC=$?
set -e
BENCH_PID=""
kill "$KILLER_PID" 2>/dev/null || true
wait "$KILLER_PID" 2>/dev/null || true
KILLER_PID=""
log "bench finished (exit $BENCH_RC); idling 15 s before the KV check"
sleep 15
kill "$SAMPLER_PID" 2>/dev/null || true
wait "$SAMPLER_PID" 2>/dev/null || true
SAMPLER_PID=""

# ---- KV accounting -------------------------------------------------------
KV_OK=1
: >"$OUT/kv.txt"
cluster=$(curl -s --max-time 5 "http://127.0.0.1:$PORT/v1/cluster" || true)
addrs=$(grep -o '"metrics_address": *"[^"]*"' <<<"$cluster" | sed 's/.*"\([^"]*\)"$/\1/')
ids=$(grep -o '"id": *"[^"]*"' <<<"$cluster" | sed 's/.*"\([^"]*\)"$/\1/' | grep -v '^router$' || true)
if [ -z "$addrs" ]; then
	echo "no worker listed by /v1/cluster" >>"$OUT/kv.txt"
	KV_OK=0
fi
set -- $ids
for a in $addrs; do
	id=${1:-?}
	shift || true
	m=$(curl -s --max-time 5 "http://$a/metrics" || true)
	val() { awk -v s="$1" 'index($0, s) == 1 {print $2}' <<<"$m" | head -1; }
	free=$(val 'tandem:kv_blocks{state="free"}')
	used=$(val 'tandem:kv_blocks{state="used"}')
	idle=$(val 'tandem:kv_blocks{state="cached_idle"}')
	total=$(val 'tandem:kv_capacity_blocks')
	ok=yes
	if [ -z "$total" ] || [ $((free + used + idle)) -ne "$total" ] || [ "$used" -ne 0 ]; then
		ok=NO
		KV_OK=0
	fi
	printf '%-12s %-16s free %6s used %4s cached_idle %6s total %6s balanced+idle: %s\n' \
		"$id" "$a" "$free" "$used" "$idle" "$total" "$ok" >>"$OUT/kv.txt"
done

# ---- Report --------------------------------------------------------------
R="$OUT/requests.jsonl"
n_rec=$(wc -l <"$R" 2>/dev/null || echo 0)
n_ok=$(grep -c '"ok": *true' "$R" 2>/dev/null || true)
reasons=$(grep -o '"reason": *"[a-z_0-9]*"' "$R" 2>/dev/null | sed 's/.*"\([^"]*\)"$/\1/' | sort | uniq -c || true)
n_timeout=$(grep -c '"reason": *"timeout"' "$R" 2>/dev/null || true)
n_closed=$(grep -c '"reason": *"closed"' "$R" 2>/dev/null || true)
# Records are written for every request sent; a sent request without one vanished.
n_sent=$(grep -o '"completed": *[0-9]*\|"failed": *[0-9]*' "$OUT/summary.json" 2>/dev/null |
	awk -F: '{s += $2} END {print s + 0}')
n_missing=$((n_sent > n_rec ? n_sent - n_rec : 0))
n_short=$(awk 'function num(key,   v) {
		if (!match($0, "\"" key "\": *[0-9]+")) return -1
		v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v); return v + 0
	}
	/"ok": *true/ && num("output_tokens") < num("target_output_len") { n++ }
	END { print n + 0 }' "$R" 2>/dev/null || echo 0)
lost=$((n_timeout + n_closed + n_missing))
n_kills=$(($(wc -l <"$OUT/kills.csv") - 1))
elapsed=$(now)

rss_report=$(awk -F, 'NR > 1 {
	k = $2 " " $3
	if (!(k in first)) { first[k] = $4; t0[k] = $1; min[k] = $4; max[k] = $4; order[++n] = k }
	last[k] = $4; t1[k] = $1; cnt[k]++
	if ($4 < min[k]) min[k] = $4
	if ($4 > max[k]) max[k] = $4
	# the first sample after a minute of life is the baseline (warm-up done)
	if (!(k in base) && $1 - t0[k] >= 60) base[k] = $4
} END {
	printf "%-12s %8s %7s %9s %9s %9s %9s %9s %8s\n", "process", "pid", "life_s", "first_kb", "base_kb", "last_kb", "min_kb", "max_kb", "growth"
	for (i = 1; i <= n; i++) {
		k = order[i]; split(k, a, " ")
		b = (k in base) ? base[k] : first[k]
		g = b > 0 ? 100.0 * (last[k] - b) / b : 0
		printf "%-12s %8s %7d %9d %9d %9d %9d %9d %7.1f%%\n", a[1], a[2], t1[k] - t0[k], first[k], b, last[k], min[k], max[k], g
	}
}' "$OUT/rss.csv")

{
	echo "soak: $(date -u +%Y-%m-%dT%H:%M:%SZ), ran ${elapsed}s (load ${DURATION}s), seed $SEED"
	echo "cluster $CLUSTER; bench: rate $RATE/s, concurrency $CONC, input $IN_LEN +-50%, output $OUT_LEN, timeout ${TIMEOUT}s"
	echo "worker kills (SIGKILL): $n_kills (kills.csv)"
	echo
	echo "requests: sent $n_sent, records $n_rec, succeeded $n_ok (of which $n_short ended early:"
	echo "  finish_reason abort, fewer tokens than asked)"
	echo "failures by reason (what the client saw):"
	if grep -q '^Failed (' "$OUT/bench.log" 2>/dev/null; then
		grep '^Failed (' "$OUT/bench.log" | sed 's/^/  /'
	elif [ -n "$reasons" ]; then echo "$reasons"; else echo "  none"; fi
	echo "LOST (hung $n_timeout + closed without an answer $n_closed + vanished $n_missing): $lost"
	echo
	echo "resident memory per process incarnation (VmRSS, sampled every ${SAMPLE}s; growth = last vs the first sample after 60 s):"
	echo "$rss_report"
	echo
	echo "KV blocks at the end (idle):"
	cat "$OUT/kv.txt"
	echo
	grep -A 40 '^====' "$OUT/bench.log" | head -60 || true
} | tee "$OUT/report.txt"

if [ "$lost" -eq 0 ] && [ "$KV_OK" -eq 1 ] && [ "$n_sent" -gt 0 ]; then
	log "PASS"
	exit 0
fi
log "FAIL"
exit 1
