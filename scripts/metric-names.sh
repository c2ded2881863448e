#!/bin/sh
# Prints every metric name a running default cluster exports, router and workers
# apart, so two builds can be compared (issue 13 checked "every /metrics name stays
# as it is" this way):
#
#   scripts/metric-names.sh BIN_DIR PORT > names.txt
#   e.g. scripts/metric-names.sh build/bin 18200 > new.txt; diff old.txt new.txt
#
# Starts `BIN_DIR/tandem up --port PORT` (the default cluster), sends one
# completion, scrapes the router's /metrics and each worker's (addresses from
# /v1/cluster), stops the cluster. Needs curl. With TANDEM_API_KEY set, sends it.
set -eu
bin=$1
port=$2
dir=$(mktemp -d)
"$bin/tandem" up --port "$port" --run-dir "$dir/run" >"$dir/up.out" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null || true; wait $up 2>/dev/null || true; rm -rf "$dir"' EXIT
i=0
until grep -q "READY id=up" "$dir/up.out"; do
	i=$((i + 1))
	if [ "$i" -gt 240 ]; then
		echo "metric-names: the cluster did not come up (log: $dir/up.out)" >&2
		cat "$dir/up.out" >&2
		exit 1
	fi
	sleep 0.25
done
url=http://127.0.0.1:$port
curl -sf "$url/v1/completions" ${TANDEM_API_KEY:+-H "Authorization: Bearer $TANDEM_API_KEY"} -H 'Content-Type: application/json' \
	-d '{"model":"tiny","prompt":"Hello there","max_tokens":4}' >/dev/null
names() { grep -v '^#' | sed 's/[{ ].*//' | sort -u; }
echo "# router"
curl -sf "$url/metrics" | names
echo "# workers"
for m in $(curl -sf ${TANDEM_API_KEY:+-H "Authorization: Bearer $TANDEM_API_KEY"} "$url/v1/cluster" | grep -o '"metrics[a-z_]*":"[^"]*"' | sed 's/.*:"//;s/"$//'); do
	curl -sf "http://$m/metrics"
done | names
