#!/bin/sh
# The README's first Quick start command, on a fresh Debian 12 machine as root:
#   1. installs the Debian packages (deploy/install-deps.sh) and builds (build/);
#   2. starts the default cluster with `tandem up` (tandem-router on
#      127.0.0.1:8000, one tandem-prefill and one tandem-decode worker, the tiny
#      model; logs in run/latest/) and waits until it is READY;
#   3. sends one completion with curl and prints the answer;
#   4. keeps the cluster running in the foreground until Ctrl-C (or SIGTERM),
#      which stops every process; the exit code is tandem up's (0 after a stop).
# Arguments are passed to `tandem up`, e.g. ./deploy/run.sh --port 8001 or
# ./deploy/run.sh -c deploy/clusters/tiny-2p2d.yaml.
set -eu
cd "$(dirname "$0")/.."

./deploy/install-deps.sh
# shellcheck disable=SC2086
cmake -S . -B build ${TANDEM_CMAKE_FLAGS:-}
cmake --build build -j"$(nproc)"

out=$(mktemp)
# tandem up runs in its own session (setsid), so a Ctrl-C in the terminal
# reaches this script only, which forwards it once: tandem up takes a second
# SIGINT as "kill everything now".
setsid build/bin/tandem up "$@" >"$out" &
up=$!
stop() {
	kill -INT "$up" 2>/dev/null || true
}
trap stop INT TERM
trap 'rm -f "$out"' EXIT

# tandem up prints the endpoints, then "READY id=up http=<host:port> run_dir=<dir>".
waited=0
while ! grep -q '^READY id=up ' "$out"; do
	if ! kill -0 "$up" 2>/dev/null; then
		cat "$out"
		status=0
		wait "$up" || status=$?
		echo "run: tandem up exited (code $status) before the cluster was ready; see its messages above" >&2
		exit 1
	fi
	if [ "$waited" -ge 1200 ]; then
		echo "run: the cluster was not ready after 120 s; stopping it" >&2
		stop
		wait "$up" || true
		exit 1
	fi
	sleep 0.1
	waited=$((waited + 1))
done
cat "$out"
http=$(sed -n 's/^READY id=up http=\([^ ]*\) .*/\1/p' "$out")
case "$http" in 0.0.0.0:*) http="127.0.0.1:${http#0.0.0.0:}" ;; esac

echo
echo "run: a demo request (the tiny model has random weights: expect gibberish text):"
echo "  curl -s http://$http/v1/completions -H 'Content-Type: application/json' \\"
echo "       -d '{\"model\":\"tiny\",\"prompt\":\"Tandem serves prefill and decode on\",\"max_tokens\":16}'"
curl -sS --max-time 60 "http://$http/v1/completions" -H 'Content-Type: application/json' \
	-d '{"model":"tiny","prompt":"Tandem serves prefill and decode on","max_tokens":16}' ||
	echo "run: the demo request failed (see run/latest/*.log)" >&2
echo
echo
echo "run: the cluster keeps running at http://$http (OpenAI API under /v1; logs in run/latest/)."
echo "run: press Ctrl-C to stop it (or send SIGTERM to pid $$)."

# Wait for tandem up; a trapped signal interrupts wait, so wait again until it is gone.
status=0
while kill -0 "$up" 2>/dev/null; do
	status=0
	wait "$up" || status=$?
done
exit "$status"
