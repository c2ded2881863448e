#!/bin/sh
# tandem up N times (default cluster): start, 2 streams in flight, SIGTERM; prints each
# process's exit and how many stop-watchdog lines its logs hold (docs/reliability.md,
# "Stopping"). Usage: scripts/up-stop-loop.sh N   (BIN=bin dir, default build/bin; TMP dir)
bin=${BIN:-build/bin}
i=0
while [ $i -lt "$1" ]; do
    i=$((i + 1))
    d=$(mktemp -d "${TMP:-/tmp}/upstop.XXXXXX")
    "$bin/tandem" up --port 0 --run-dir "$d/run" --stop-timeout 15 >"$d/up.out" 2>"$d/up.err" &
    up=$!
    n=0; port=""
    while [ $n -lt 300 ] && [ -z "$port" ]; do
        port=$(grep -o 'http://127.0.0.1:[0-9]*' "$d/up.err" "$d/up.out" 2>/dev/null | head -1 | sed 's/.*://')
        [ -n "$port" ] && curl -s "http://127.0.0.1:$port/health" >/dev/null || port=""
        sleep 0.1; n=$((n + 1))
    done
    n=0; while [ $n -lt 300 ]; do
        h=$(curl -s "http://127.0.0.1:$port/v1/cluster" | grep -o '"healthy":true' | wc -l)
        [ "$h" -ge 2 ] && break; sleep 0.1; n=$((n + 1)); done
    curl -sN "http://127.0.0.1:$port/v1/completions" -d '{"prompt":"a","max_tokens":300,"stream":true,"ignore_eos":true}' >/dev/null 2>&1 &
    curl -sN "http://127.0.0.1:$port/v1/completions" -d '{"prompt":"b","max_tokens":300,"stream":true,"ignore_eos":true}' >/dev/null 2>&1 &
    sleep 0.3
    kill -TERM $up; wait $up; rc=$?
    wait
    echo "run $i: tandem up $rc; $(grep -h 'exited: ' "$d/up.err" | sed 's/.*: \([a-z0-9-]*\) exited: /\1=/' | tr '\n' ' ') watchdog lines: $(cat "$d"/run/*.log 2>/dev/null | grep -c "stop watchdog\|shutdown still blocked")"
done
