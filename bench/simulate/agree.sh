#!/bin/sh
# Agreement of `tandem simulate` with the live cluster (issue 14, docs/simulate-agreement.md):
# the three sim-70B experiments of deploy/experiments/ at three rates each, run live
# (`tandem bench --experiment F --rates R`: tandem up, real time) and offline (`... --offline`),
# compared cell by cell from the two reports' results.csv. Bounds: goodput within 10%, TTFT
# and TPOT p50/p90 within 15% (ratio offline/live in [0.90, 1.10] and [0.85, 1.15]).
#
#   bench/simulate/agree.sh [BIN_DIR] [OUT_DIR]
#
# Defaults: build/bin, run/agree-<YYYYmmdd-HHMMSS>. Wall time: about 20 minutes (the live
# cells run at time_scale 1, each its file's duration of arrivals plus warm-ups, a cluster
# start and a drain); the offline runs take seconds. A live report already in OUT_DIR is
# reused (so a rerun after a simulator change only redoes the offline side); AGREE_LIVE=0
# runs no live cell at all (the tables then compare what live reports OUT_DIR holds).
#
# Besides the files as they are (offline `off/`), the offline side also runs a copy of the
# experiments whose cluster files use ipc:// instead of tcp:// with base_port 0 (`off-ipc/`):
# the simulator gives every worker the plan's data address, which for tcp with base_port 0
# is the same `tcp://127.0.0.1:0` for all, so a decode worker takes every job's prefill
# address for its own and prefills locally (docs/simulate-agreement.md, "Findings"). The
# transport is not modelled otherwise, so off-ipc is what the offline model says once the
# addresses are unique.
#
# Prints one markdown table per offline variant: per cell, live / offline (offline/live)
# and ok or FAIL per metric, with the live cell's host busy share and load average; then
# the counts. Exit status 0 whatever the agreement (it is a measurement).
set -eu
BIN=${1:-build/bin}
OUT=${2:-run/agree-$(date +%Y%m%d-%H%M%S)}
HERE=$(cd "$(dirname "$0")" && pwd)
DEPLOY=$(cd "$HERE/../../deploy" && pwd)
TANDEM=$(cd "$BIN" && pwd)/tandem
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# name and rates (low, mid, high of the file's own rates; sim-70b-pd-deciders has only 4 and
# 8, so its mid rate 6 is added between them)
EXPERIMENTS="sim-70b-disagg-vs-colocated-prefill-heavy:2,8,16
sim-70b-disagg-vs-colocated-decode-heavy:4,12,24
sim-70b-pd-deciders:4,6,8"

# The ipc copy: deploy/{experiments,clusters,routing} with every cluster file's transport
# block dropped (the default transport is ipc://), so relative paths resolve as before.
IPC=$OUT/deploy-ipc
rm -rf "$IPC"
mkdir -p "$IPC/clusters"
cp -r "$DEPLOY/experiments" "$DEPLOY/routing" "$IPC/"
for f in "$DEPLOY"/clusters/*.yaml; do
	awk '/^transport:/ { skip = 1; next } skip && /^[ \t]/ { next } { skip = 0; print }' \
		"$f" >"$IPC/clusters/$(basename "$f")"
done

echo "# agree.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo '?')" |
	tee "$OUT/agree.log"
echo "# load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/agree.log"
for line in $EXPERIMENTS; do
	name=${line%%:*}
	rates=${line#*:}
	d=$OUT/$name
	mkdir -p "$d"
	for variant in off off-ipc; do
		file=$DEPLOY/experiments/$name.yaml
		[ "$variant" = off-ipc ] && file=$IPC/experiments/$name.yaml
		rm -rf "${d:?}/$variant"
		"$TANDEM" bench --experiment "$file" --rates "$rates" --offline --out "$d/$variant" \
			>"$d/$variant.log" 2>&1 || echo "$name $variant: exit $? (see $d/$variant.log)"
	done
	if [ "${AGREE_LIVE:-1}" = 0 ]; then
		continue
	fi
	if [ -s "$d/live/results.csv" ]; then
		echo "$name: live report reused ($d/live)" | tee -a "$OUT/agree.log"
		continue
	fi
	t0=$(date +%s)
	echo "$name: live at $rates req/s, load average $(cut -d' ' -f1-3 /proc/loadavg)" |
		tee -a "$OUT/agree.log"
	"$TANDEM" bench --experiment "$DEPLOY/experiments/$name.yaml" --rates "$rates" \
		--out "$d/live" >"$d/live.log" 2>&1 || echo "$name live: exit $? (see $d/live.log)"
	echo "$name: live took $(($(date +%s) - t0)) s, load average $(cut -d' ' -f1-3 /proc/loadavg)" |
		tee -a "$OUT/agree.log"
done

# shellcheck disable=SC2046 # one argument per experiment name
python3 - "$OUT" $(echo "$EXPERIMENTS" | sed 's/:.*//') <<'PY' | tee "$OUT/agree.md"
import csv, math, sys

out, names = sys.argv[1], sys.argv[2:]
METRICS = [("request_goodput", "goodput", 0.10), ("ttft_p50_ms", "TTFT p50", 0.15),
           ("ttft_p90_ms", "TTFT p90", 0.15), ("tpot_p50_ms", "TPOT p50", 0.15),
           ("tpot_p90_ms", "TPOT p90", 0.15)]

def rows(path):
    try:
        with open(path) as f:
            return {(r["config"], r["rate"]): r for r in csv.DictReader(f)}
    except OSError:
        return {}

def num(r, k):
    try:
        v = float(r.get(k, ""))
        return v if math.isfinite(v) else None
    except ValueError:
        return None

def judge(live, off, tol):
    if live is None or off is None:
        return None, "n/a"
    if live == 0 and off == 0:
        return 1.0, "ok"
    if live == 0:
        return math.inf, "FAIL"
    ratio = off / live
    return ratio, "ok" if abs(ratio - 1) <= tol + 1e-9 else "FAIL"

def fmt(v):
    return "-" if v is None else ("%.2f" % v if abs(v) < 100 else "%.0f" % v)

for variant in ("off", "off-ipc"):
    print("\n## live vs %s (offline/live; goodput within 10%%, latencies within 15%%)\n" % variant)
    print("| experiment | config | rate | " + " | ".join(m[1] for m in METRICS) +
          " | live host busy, load1 |")
    print("|---|---|---:|" + "---|" * len(METRICS) + "---|")
    counts = {m[0]: [0, 0] for m in METRICS}
    for name in names:
        live = rows("%s/%s/live/results.csv" % (out, name))
        off = rows("%s/%s/%s/results.csv" % (out, name, variant))
        for key in sorted(live, key=lambda k: (float(k[1]), k[0])):
            l, o = live[key], off.get(key, {})
            cells = []
            for k, _, tol in METRICS:
                lv, ov = num(l, k), num(o, k)
                ratio, verdict = judge(lv, ov, tol)
                if verdict != "n/a":
                    counts[k][0] += verdict == "ok"
                    counts[k][1] += 1
                cells.append("%s / %s (%s) %s" % (fmt(lv), fmt(ov),
                             "-" if ratio is None else ("inf" if math.isinf(ratio)
                                                         else "%.2f" % ratio), verdict))
            busy = num(l, "host_busy")
            machine = "%s, %s-%s" % ("-" if busy is None else "%.0f%%" % (100 * busy),
                                     l.get("load1_start", "-"), l.get("load1_end", "-"))
            short = name.replace("sim-70b-disagg-vs-colocated-", "").replace("sim-70b-", "")
            print("| %s | %s | %s | %s | %s |" % (short, key[0], key[1], " | ".join(cells),
                                                 machine))
    print("\nwithin bounds: " + ", ".join("%s %d/%d" % (m[1], counts[m[0]][0], counts[m[0]][1])
                                          for m in METRICS))
PY
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/agree.log"
echo "# report: $OUT/agree.md"
