#!/bin/sh
# Starts a router with one prefill and one decode tiny worker over ipc://,
# stops the router (SIGTERM) once both are healthy, and counts stops that
# outlive HANG_S seconds; for each, all threads' backtraces go to
# $OUT/hang-<n>.txt (gdb). Usage: scripts/repro-stop-hang.sh [runs] [bin dir]
# Env: WHO=router|worker (which process to stop; default router), HANG_S (1).
set -u
runs=${1:-30}
bin=${2:-build/bin}
who=${WHO:-router}
hang_s=${HANG_S:-1}
OUT=${OUT:-/tmp/repro-stop-hang}
mkdir -p "$OUT"
hangs=0
i=0
while [ "$i" -lt "$runs" ]; do
    i=$((i + 1))
    dir=$(mktemp -d /tmp/rsh.XXXXXX)
    ann="ipc://$dir/announce.ipc"
    "$bin/tandem-router" --announce "$ann" --port 0 --log-level error >"$dir/r.out" 2>"$dir/r.err" &
    rp=$!
    n=0
    while ! grep -q READY "$dir/r.out" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
    port=$(sed -n 's/.*http=[^:]*:\([0-9]*\).*/\1/p' "$dir/r.out")
    "$bin/tandem-prefill" --router "$ann" --log-level error >/dev/null 2>"$dir/p.err" &
    pp=$!
    "$bin/tandem-decode" --router "$ann" --log-level error >/dev/null 2>"$dir/d.err" &
    dp=$!
    np=${NP:-1}
    k=1
    while [ $k -lt $np ]; do
        "$bin/tandem-prefill" --router "$ann" --log-level error >/dev/null 2>>"$dir/p.err" &
        pp="$pp $!"
        "$bin/tandem-decode" --router "$ann" --log-level error >/dev/null 2>>"$dir/d.err" &
        dp="$dp $!"
        k=$((k + 1))
    done
    n=0
    while [ $n -lt 200 ]; do
        h=$(curl -s "http://127.0.0.1:$port/v1/cluster" | grep -o '"healthy":true' | wc -l)
        [ "$h" -ge $((2 * np)) ] && break
        sleep 0.05
        n=$((n + 1))
    done
    s=0
    while [ $s -lt ${STREAMS:-0} ]; do
        curl -s -N -m 20 -o "$dir/c$s.out" "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"stream\":true}" &
        s=$((s + 1))
    done
    [ "${STREAMS:-0}" -gt 0 ] && sleep 0.3
    case $who in
    router) victim=$rp ;;
    prefill) victim=${pp%% *} ;;
    *) victim=${dp%% *} ;;
    esac
    kill -TERM "$victim"
    n=0
    while kill -0 "$victim" 2>/dev/null && [ $n -lt $((hang_s * 20)) ]; do sleep 0.05; n=$((n + 1)); done
    if kill -0 "$victim" 2>/dev/null; then
        hangs=$((hangs + 1))
        gdb -p "$victim" -batch -ex 'thread apply all bt' >"$OUT/hang-$i.txt" 2>&1
        echo "run $i: $who $victim still running after ${hang_s} s: $OUT/hang-$i.txt"
    fi
    kill -TERM $rp $pp $dp 2>/dev/null
    wait
    cat "$dir"/*.err | grep -i "watchdog\|blocked" && echo "run $i: watchdog message above"
    rm -rf "$dir"
done
echo "$hangs of $runs stops of the $who outlived ${hang_s} s"
