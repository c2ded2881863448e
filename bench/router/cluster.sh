# Sourced by the router benchmarks (throughput.sh, vs_nginx.sh, stream.sh).
# POSIX sh; the caller runs with set -eu and sets BIN (build/bin).
#
# rt_cluster_tmp NAME: makes TMP (a scratch directory) and PIDS (processes to
#   stop) and, at exit, kills and waits for every PID in PIDS and removes TMP.
# rt_cluster_start WORKERS: starts tandem-router and WORKERS colocated sim
#   workers and waits until every worker is healthy; sets PORT and ROUTER_PID.
#   Optional: ROUTER_BIN ($BIN/tandem-router), TIME_SCALE (0: steps take no
#   modelled time), WORKER_FLAGS (more tandem-decode flags), ROUTING (an
#   EndpointPickerConfig file), ROUTER_FLAGS (more tandem-router flags), TASKSET_ROUTER
#   (cpu list for taskset).

MODEL=${MODEL:-llama-3-8b}

rt_cluster_cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}

rt_cluster_tmp() {
	TMP=$(mktemp -d "/tmp/tandem-bench-$1-XXXXXX")
	PIDS=""
	trap rt_cluster_cleanup EXIT INT TERM
}

rt_cluster_start() {
	_pin=""
	[ -n "${TASKSET_ROUTER:-}" ] && _pin="taskset -c $TASKSET_ROUTER"
	_ann="ipc://$TMP/announce.ipc"
	_n=$1
	set -- --port 0 --announce "$_ann" --model "$MODEL" --log-level warn
	[ -n "${ROUTING:-}" ] && set -- "$@" --routing "$ROUTING"
	# shellcheck disable=SC2086
	[ -n "${ROUTER_FLAGS:-}" ] && set -- "$@" $ROUTER_FLAGS
	$_pin "${ROUTER_BIN:-$BIN/tandem-router}" "$@" >"$TMP/router.out" 2>"$TMP/router.err" &
	PIDS="$PIDS $!"
	ROUTER_PID=$!
	_i=0
	while ! grep -q READY "$TMP/router.out" 2>/dev/null; do
		_i=$((_i + 1))
		[ $_i -gt 100 ] && { echo "tandem-router did not start (below: its stderr)" >&2; cat "$TMP/router.err" >&2; exit 1; }
		sleep 0.05
	done
	PORT=$(sed -n 's/.*http=[^ ]*:\([0-9]*\) .*/\1/p' "$TMP/router.out")

	_w=0
	while [ $_w -lt "$_n" ]; do
		# shellcheck disable=SC2086
		"$BIN/tandem-decode" --colocated --backend sim --model "$MODEL" --time-scale "${TIME_SCALE:-0}" \
			--max-running 512 --max-waiting 4096 --router "$_ann" --log-level warn ${WORKER_FLAGS:-} \
			>"$TMP/w$_w.out" 2>"$TMP/w$_w.err" &
		PIDS="$PIDS $!"
		_w=$((_w + 1))
	done
	_i=0
	until curl -s "http://127.0.0.1:$PORT/health" | grep -q "\"healthy_endpoints\":$_n}"; do
		_i=$((_i + 1))
		[ $_i -gt $((200 + 20 * _n)) ] && { echo "workers did not register with the router (see $TMP/w*.err)" >&2; exit 1; }
		sleep 0.05
	done
}
