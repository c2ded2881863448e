#!/bin/sh
# The router against nginx, same machine, same minute (issue 18): starts
# tandem-router with zero-time sim workers (cluster.sh) and an nginx (Debian's
# package, one process) that proxies to a second nginx serving a fixed body of
# the router's response size, then runs the same wrk load against each in
# turn, ROUNDS times, and prints req/s, p99 and the router/nginx ratios.
# What each side does per request: docs/performance.md ("## router").
#
#   bench/router/vs_nginx.sh [build/bin]
# Environment: ROUNDS (5), DURATION (10 s per run), CONNS (32), THREADS (1),
# WORKERS (2), NGINX (/usr/sbin/nginx), ROUTING, WRK_BODY as throughput.sh.
# Output: one "RUN" line per run, one "ROUND" line per pair, then "SUMMARY"
# with the medians.
set -eu

BIN=${1:-build/bin}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}
WORKERS=${WORKERS:-2}
NGINX=${NGINX:-/usr/sbin/nginx}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster.sh"
rt_cluster_tmp vs-nginx

command -v wrk >/dev/null || { echo "vs_nginx.sh: wrk is not installed (deploy/install-deps.sh)" >&2; exit 1; }
[ -x "$NGINX" ] || { echo "vs_nginx.sh: no nginx at $NGINX (deploy/install-deps.sh installs nginx-light; or set NGINX)" >&2; exit 1; }

rt_cluster_start "$WORKERS"
URL_R="http://127.0.0.1:$PORT/v1/completions"

# The router's answer to the benchmark's request, to give the upstream the
# same body size (its text is empty: the sim worker's tokens decode to "").
body=$(curl -s -X POST -H 'Content-Type: application/json' \
	-d "${WRK_BODY:-{\"model\":\"$MODEL\",\"prompt\":\"Tandem routes this short prompt.\",\"max_tokens\":4,\"temperature\":0\}}" "$URL_R")
case $body in
'{"id":'*) ;;
*) echo "vs_nginx.sh: the router did not answer the benchmark's request with a completion: $body" >&2; exit 1 ;;
esac
# nginx's return takes a quoted string: escape backslashes and quotes.
nbody=$(printf '%s' "$body" | sed 's/\\/\\\\/g; s/"/\\"/g')

# A loopback port nobody listens on (nginx cannot report an ephemeral one).
free_port() {
	_p=$(($(od -An -N2 -tu2 /dev/urandom) % 20000 + 20000))
	while ss -Htln "sport = :$_p" | grep -q .; do _p=$((_p + 1)); done
	echo "$_p"
}
UP_PORT=$(free_port)
NG_PORT=$(free_port)
while [ "$NG_PORT" = "$UP_PORT" ]; do NG_PORT=$(free_port); done

# Both nginx run in the foreground as a single process (no master): one
# worker each, no access log (the router writes none), upstream connections
# kept alive (the router's links to its workers are long-lived too).
mkdir -p "$TMP/ng"
nginx_conf() { # $1 = server block
	cat <<CONF
daemon off;
master_process off;
worker_processes 1;
pid $TMP/ng/\$2.pid;
error_log $TMP/ng/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $TMP/ng/body;
    proxy_temp_path $TMP/ng/proxy;
    fastcgi_temp_path $TMP/ng/fastcgi;
    uwsgi_temp_path $TMP/ng/uwsgi;
    scgi_temp_path $TMP/ng/scgi;
    keepalive_requests 1000000;
$1
}
CONF
}
nginx_conf "    server {
        listen 127.0.0.1:$UP_PORT;
        location / { default_type application/json; return 200 \"$nbody\"; }
    }" | sed "s/\\\$2/up/" >"$TMP/ng/up.conf"
nginx_conf "    upstream tandem_static { server 127.0.0.1:$UP_PORT; keepalive 64; }
    server {
        listen 127.0.0.1:$NG_PORT;
        location / {
            proxy_pass http://tandem_static;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }" | sed "s/\\\$2/front/" >"$TMP/ng/front.conf"
for c in up front; do
	"$NGINX" -p "$TMP/ng" -c "$TMP/ng/$c.conf" >"$TMP/ng/$c.out" 2>&1 &
	PIDS="$PIDS $!"
done
URL_N="http://127.0.0.1:$NG_PORT/v1/completions"
i=0
until [ "$(curl -s -o /dev/null -w '%{size_download}' -X POST -d x "$URL_N")" = "${#body}" ]; do
	i=$((i + 1))
	[ $i -gt 100 ] && { echo "vs_nginx.sh: nginx did not answer on $URL_N with a ${#body}-byte body (below: its logs)" >&2; cat "$TMP/ng/"*.out "$TMP/ng/error.log" >&2; exit 1; }
	sleep 0.05
done

echo "router $URL_R ($WORKERS zero-time sim workers), nginx $URL_N -> 127.0.0.1:$UP_PORT (${#body}-byte body)"
echo "wrk -t$THREADS -c$CONNS -d${DURATION}s, $ROUNDS rounds, router first in each; $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"

run_wrk() { # $1 = url, $2 = seconds; prints wrk's RESULT line
	wrk -t"$THREADS" -c"$CONNS" -d"$2s" --latency -s "$HERE/completions.lua" "$1" | grep '^RESULT'
}
field() { # $1 = RESULT line, $2 = key
	printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
run_wrk "$URL_R" 2 >/dev/null
run_wrk "$URL_N" 2 >/dev/null

r=1
: >"$TMP/rounds"
while [ $r -le "$ROUNDS" ]; do
	a=$(run_wrk "$URL_R" "$DURATION")
	b=$(run_wrk "$URL_N" "$DURATION")
	echo "RUN round=$r target=router $a"
	echo "RUN round=$r target=nginx $b"
	for k in errors non2xx; do
		[ "$(field "$a" $k)" = 0 ] && [ "$(field "$b" $k)" = 0 ] ||
			echo "vs_nginx.sh: round $r had $k (router: $(field "$a" $k), nginx: $(field "$b" $k))" >&2
	done
	echo "$(field "$a" rps) $(field "$a" p99_ms) $(field "$b" rps) $(field "$b" p99_ms)" >>"$TMP/rounds"
	awk -v r=$r '{ printf "ROUND %d router_rps=%d router_p99_ms=%.2f nginx_rps=%d nginx_p99_ms=%.2f rps_ratio=%.2f p99_ratio=%.2f\n", r, $1, $2, $3, $4, $1 / $3, $2 / $4 }' "$TMP/rounds" | tail -1
	r=$((r + 1))
done
# Medians over the rounds (of each column, and of the per-round ratios).
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf 'SUMMARY rounds=%d router_rps=%s router_p99_ms=%s nginx_rps=%s nginx_p99_ms=%s rps_ratio=%s p99_ratio=%s\n' "$ROUNDS" \
	"$(awk '{ print $1 }' "$TMP/rounds" | med)" "$(awk '{ print $2 }' "$TMP/rounds" | med)" \
	"$(awk '{ print $3 }' "$TMP/rounds" | med)" "$(awk '{ print $4 }' "$TMP/rounds" | med)" \
	"$(awk '{ printf "%.3f\n", $1 / $3 }' "$TMP/rounds" | med)" "$(awk '{ printf "%.3f\n", $2 / $4 }' "$TMP/rounds" | med)"
