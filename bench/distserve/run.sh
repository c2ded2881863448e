#!/bin/sh
# Runs DistServe's chatbot and summarization setups offline (docs/distserve.md) and writes each
# experiment's report under docs/distserve/<experiment>/, then docs/distserve/summary.md: SLO
# attainment against the per-GPU rate, the per-GPU goodput at 90% attainment (linear
# interpolation between the two rates around 90%, as DistServe's own plotting script does), and
# attainment against SLO scale at the rate the paper fixes for its SLO-scale plots.
#
#   bench/distserve/run.sh [--tandem BIN] [--out DIR] [--bench KEY=VALUE]... [--rates LIST]
#                          [EXPERIMENT ...]
#
# EXPERIMENT is a name below (default: all). BIN defaults to build/bin/tandem. Run from the
# repository root. --bench replaces (or adds) one key of the file's bench: block, e.g.
# --bench sharegpt-input-mean=700 (a sensitivity run; the summary names every replacement);
# --rates replaces the file's total rates (tandem bench --rates). Offline, the 13B file (24 cells) takes about 30 s on a 2-core machine and all
# five a few minutes (docs/distserve.md).
set -eu

TANDEM=build/bin/tandem
OUT=docs/distserve
SETS=""
RATES=""
while [ $# -gt 0 ]; do
    case "$1" in
    --tandem) TANDEM=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bench)
        case "$2" in *=*) ;; *) echo "run.sh: --bench wants KEY=VALUE, got '$2'" >&2; exit 2 ;; esac
        SETS="$SETS $2"; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    --*) echo "run.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
    esac
done

# name | GPUs per configuration | TTFT SLO ms | TPOT SLO ms | per-GPU rate of the SLO-scale plot |
# SLO scales of that plot (the paper's Fig. 8 and 9, from the artifact's plot.ipynb)
TABLE='distserve-chatbot-opt-13b|3|250|100|1.5|1.6 1.5 1.4 1.3 1.2 1.1 1.0 0.9 0.8 0.7 0.6
distserve-chatbot-opt-66b|8|2500|150|0.75|3 2.5 2 1.7 1.5 1.3 1.1 0.9 0.8 0.7
distserve-chatbot-opt-175b|21|4000|200|0.125|1.6 1.5 1.4 1.3 1.2 1.1 1.0 0.9 0.8 0.7 0.6
distserve-chatbot-opt-175b-vllm-tp8|8|4000|200|0.125|1.6 1.5 1.4 1.3 1.2 1.1 1.0 0.9 0.8 0.7 0.6
distserve-summarization-opt-66b|8|15000|150|0.375|10 8.5 7 5.5 4 2.5 1 0.8 0.55'

if [ $# -eq 0 ]; then
    set -- $(printf '%s\n' "$TABLE" | cut -d'|' -f1)
fi
[ -x "$TANDEM" ] || { echo "run.sh: no tandem binary at $TANDEM (build first, or --tandem BIN)" >&2; exit 2; }
mkdir -p "$OUT"
SUMMARY=$OUT/summary.md
{
    echo "# DistServe's setups, offline"
    echo
    echo "Written by \`bench/distserve/run.sh\` ($("$TANDEM" --version 2>/dev/null | head -1))."
    echo "What each setup is and how it differs from the paper: docs/distserve.md."
    [ -z "$SETS" ] || echo "Bench keys replaced for this run:$SETS."
    [ -z "$RATES" ] || echo "Total rates replaced for this run: $RATES."
} >"$SUMMARY"

# The experiment file, or a copy under $OUT with the --bench keys replaced (cluster paths made
# absolute, since they are relative to the file).
experiment_file() {
    src=deploy/experiments/$1.yaml
    if [ -z "$SETS" ]; then echo "$src"; return; fi
    dst=$OUT/$1.variant.yaml
    sed "s#\.\./clusters/#$(pwd)/deploy/clusters/#g" "$src" >"$dst"
    for kv in $SETS; do
        k=${kv%%=*} v=${kv#*=}
        if grep -q "^  $k:" "$dst"; then
            sed -i "s#^  $k:.*#  $k: $v   \# replaced by run.sh --bench#" "$dst"
        else
            sed -i "s#^bench:\$#bench:\n  $k: $v   \# added by run.sh --bench#" "$dst"
        fi
    done
    echo "$dst"
}

for name in "$@"; do
    row=$(printf '%s\n' "$TABLE" | awk -F'|' -v n="$name" '$1 == n')
    [ -n "$row" ] || { echo "run.sh: unknown experiment $name" >&2; exit 2; }
    gpus=$(echo "$row" | cut -d'|' -f2)
    ttft=$(echo "$row" | cut -d'|' -f3)
    tpot=$(echo "$row" | cut -d'|' -f4)
    fixed=$(echo "$row" | cut -d'|' -f5)
    scales=$(echo "$row" | cut -d'|' -f6)
    dir=$OUT/$name
    rm -rf "$dir"
    echo "[distserve] $name -> $dir" >&2
    "$TANDEM" bench --experiment "$(experiment_file "$name")" --offline --out "$dir" \
        ${RATES:+--rates "$RATES"} >&2
    {
        echo
        echo "## $name ($gpus GPUs per configuration; SLO TTFT <= $ttft ms, TPOT <= $tpot ms)"
        echo
        echo "SLO attainment (%) by per-GPU rate (req/s); the last row is the per-GPU goodput at 90%."
        echo
        awk -F, -v g="$gpus" -f bench/distserve/attainment.awk "$dir/results.csv"
        echo
        echo "SLO attainment (%) by SLO scale at $fixed req/s per GPU (both SLOs scaled; the"
        echo "requests of every seed pooled)."
        echo
        for csv in "$dir"/requests/*-r*.csv; do
            cell=$(basename "$csv" .csv)
            cell=${cell%-s[0-9]*}           # <config>-r<rate>[-s<seed>] -> <config>-r<rate>
            echo "$cell"
        done | sort -u | while read -r cell; do
            rate=${cell##*-r}
            awk -v r="$rate" -v g="$gpus" -v f="$fixed" 'BEGIN { d = r / g - f; exit !(d < 1e-9 && d > -1e-9) }' || continue
            # every seed's file, one header kept
            awk 'FNR > 1 || NR == 1' "$dir/requests/$cell".csv "$dir/requests/$cell"-s*.csv 2>/dev/null |
                awk -F, -v c="${cell%-r*}" -v ttft="$ttft" -v tpot="$tpot" -v scales="$scales" \
                    -f bench/distserve/slo_scale.awk
        done | awk '/^\| config \|/ { if (h++) next } /^\|---\|/ { if (s++) next } { print }'
    } >>"$SUMMARY"
done
echo "[distserve] summary: $SUMMARY" >&2
