# Sourced by the router benchmarks (throughput.sh, vs_nginx.sh): starts
# tandem-router and $WORKERS colocated sim workers that take zero modelled
# time (--backend sim --time-scale 0) and waits until every worker is
# healthy. Needs BIN (build/bin), TMP (a scratch directory the caller
# removes) and PIDS (the caller kills and waits for each); sets PORT.
# Optional: ROUTING (an EndpointPickerConfig file), TASKSET_ROUTER (cpu list).
# POSIX sh; the caller runs with set -eu.

MODEL=${MODEL:-llama-3-8b}

# rt_cluster_start WORKERS
rt_cluster_start() {
	_pin=""
	[ -n "${TASKSET_ROUTER:-}" ] && _pin="taskset -c $TASKSET_ROUTER"
	_ann="ipc://$TMP/announce.ipc"
	_n=$1
	set -- --port 0 --announce "$_ann" --model "$MODEL" --log-level warn
	[ -n "${ROUTING:-}" ] && set -- "$@" --routing "$ROUTING"
	$_pin "$BIN/tandem-router" "$@" >"$TMP/router.out" 2>"$TMP/router.err" &
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
		"$BIN/tandem-decode" --colocated --backend sim --model "$MODEL" --time-scale 0 \
			--max-running 512 --max-waiting 4096 --router "$_ann" --log-level warn \
			>"$TMP/w$_w.out" 2>"$TMP/w$_w.err" &
		PIDS="$PIDS $!"
		_w=$((_w + 1))
	done
	_i=0
	until curl -s "http://127.0.0.1:$PORT/health" | grep -q "\"healthy_endpoints\":$_n}"; do
		_i=$((_i + 1))
		[ $_i -gt 200 ] && { echo "workers did not register with the router in 10 s (see $TMP/w*.err)" >&2; exit 1; }
		sleep 0.05
	done
}
