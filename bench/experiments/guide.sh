#!/bin/sh
# Regenerates the numbers of docs/experiments.md's decision guide: runs the guide's experiment
# files (deploy/experiments/guide-*.yaml) offline, each into DIR/<name>/ (the report without
# its per-request records), then writes DIR/guide.md (the decision tables) and the guide's
# plots (DIR/guide-*.svg, and a PNG of each when rsvg-convert is installed).
#
#   bench/experiments/guide.sh [--tandem BIN] [--out DIR] [--tables-only] [--live] [NAME ...]
#
# NAME is a guide file's name without .yaml (default: every offline one). --tables-only skips
# the runs and rewrites the tables and plots from DIR. --live also runs the live cross-check
# (guide-live-x8: 8 sim instances, started with tandem up, 3 seeds; then the same file offline)
# and adds its table. BIN defaults to build/bin/tandem; run from the repository root. Offline
# runs go through nice -n 10. On a shared 2-core machine each disaggregation file takes 6 to
# 20 minutes, the routing file about 25, the live check about 10 (docs/experiments.md).
set -eu

TANDEM=build/bin/tandem
OUT=docs/experiments
RUN=1
LIVE=0
while [ $# -gt 0 ]; do
    case "$1" in
    --tandem) TANDEM=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --tables-only) RUN=0; shift ;;
    --live) LIVE=1; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    --*) echo "guide.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
    esac
done

# The disaggregation files: workload | prompt tokens | output tokens | SLO set
PD='guide-prefill-heavy-tight|4096|64|tight
guide-prefill-heavy-loose|4096|64|loose
guide-balanced-tight|1024|256|tight
guide-balanced-loose|1024|256|loose
guide-decode-heavy-tight|256|1024|tight
guide-decode-heavy-loose|256|1024|loose'
ROUTING=guide-prefix-routing-x256
COLO=colo-256,colo-512,colo-1024,colo-2048

if [ $# -eq 0 ]; then
    set -- $(printf '%s\n' "$PD" | cut -d'|' -f1) $ROUTING
fi
mkdir -p "$OUT"

# One experiment offline into $OUT/$1 (kept: summary, CSVs, plots, cells, configs).
run_offline() {
    name=$1
    shift
    [ -x "$TANDEM" ] || { echo "guide.sh: no tandem binary at $TANDEM (build first, or --tandem BIN)" >&2; exit 2; }
    rm -rf "$OUT/$name.tmp"
    echo "guide.sh: $name ($(date -u +%H:%M:%S) UTC)" >&2
    nice -n 10 "$TANDEM" bench --experiment "deploy/experiments/$name.yaml" --offline \
        --out "$OUT/$name.tmp" "$@" >"$OUT/$name.log" 2>&1 ||
        { echo "guide.sh: $name failed, see $OUT/$name.log" >&2; return 1; }
    rm -rf "$OUT/$name.tmp/requests" "$OUT/$name.tmp/runs" "$OUT/$name.tmp/logs" "$OUT/$name"
    mv "$OUT/$name.tmp" "$OUT/$name"
    rm -f "$OUT/$name.log"
}

if [ "$RUN" = 1 ]; then
    for name in "$@"; do
        if [ "$name" = "$ROUTING" ]; then
            run_offline "$name"
        else
            run_offline "$name" --only "$COLO"
        fi
    done
fi
