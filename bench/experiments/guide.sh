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
# runs go through nice -n 10. On a shared 2-core machine (load 5-18) each file took 6 to 40
# minutes, the routing file the longest, the live check about 5 (docs/experiments.md).
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

# The disaggregation files: name | prompt tokens | output tokens | SLO set | GPUs | colocated labels
PD='guide-prefill-heavy-tight|4096|64|tight|64|colo-256,colo-512,colo-1024,colo-2048
guide-prefill-heavy-loose|4096|64|loose|64|colo-256,colo-512,colo-1024,colo-2048
guide-balanced-tight|1024|256|tight|64|colo-256,colo-512,colo-1024,colo-2048
guide-balanced-loose|1024|256|loose|64|colo-256,colo-512,colo-1024,colo-2048
guide-decode-heavy-tight|128|512|tight|16|colo-256,colo-512,colo-2048
guide-decode-heavy-loose|128|512|loose|16|colo-256,colo-512,colo-2048'
ROUTING=guide-prefix-routing-x256
RATES=guide-prefill-heavy-rates
BRATES=guide-balanced-rates

if [ $# -eq 0 ]; then
    set -- $(printf "%s\n" "$PD" | cut -d"|" -f1) $RATES $BRATES $ROUTING guide-mechanisms
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

# The mechanism probes the guide quotes: single tandem simulate runs (seed 1) of P:D splits of
# the 64 GPUs around the prefill-heavy optimum, into $OUT/guide-mechanisms.md.
mechanisms() {
    [ -x "$TANDEM" ] || { echo "guide.sh: no tandem binary at $TANDEM (build first, or --tandem BIN)" >&2; exit 2; }
    echo "guide.sh: guide-mechanisms ($(date -u +%H:%M:%S) UTC)" >&2
    tmp=$(mktemp -d)
    routing=$(cd deploy/routing && pwd)/pd-always.yaml
    {
        echo "# Mechanism probes of the decision guide"
        echo
        echo "Written by \`bench/experiments/guide.sh guide-mechanisms\`: one \`tandem simulate\` run per row, seed 1, 4096-token"
        echo "prompts, 64-token outputs, 20 s of arrivals, SLOs TTFT <= 1 s and TPOT <= 25 ms, on splits of"
        echo "deploy/clusters/offline/guide-70b-pd-x16.yaml (P prefill and 16 - P decode instances). The command of each:"
        echo
        echo '    tandem simulate -c SPLIT.yaml --dataset-name random --random-input-len 4096 --random-output-len 64 \'
        echo '        --request-rate RATE --duration 20 --seed 1 --goodput ttft:1000 tpot:25 --percentile-metrics ttft,tpot,itl --metric-percentiles 50,99'
        echo
        echo "| split | rate (req/s) | TTFT p50 (ms) | TTFT p99 | TPOT p50 (ms) | TPOT p99 | inside TTFT (%) | inside TPOT (%) | inside both (%) |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        for split in 12:4 14:2 15:1; do
            p=${split%:*}
            d=${split#*:}
            awk -v p="$p" -v d="$d" -v r="$routing" '
                /^  prefill:/ { pool = "p" } /^  decode:/ { pool = "d" }
                /^routing:/ { print "routing: " r; next }
                /^    count:/ { print "    count: " (pool == "p" ? p : d); next } { print }' \
                deploy/clusters/offline/guide-70b-pd-x16.yaml >"$tmp/split.yaml"
            for rate in 30 36; do
                nice -n 10 "$TANDEM" simulate -c "$tmp/split.yaml" --dataset-name random \
                    --random-input-len 4096 --random-output-len 64 --request-rate "$rate" --duration 20 \
                    --seed 1 --goodput ttft:1000 tpot:25 --percentile-metrics ttft,tpot,itl \
                    --metric-percentiles 50,99 2>/dev/null | awk -v s="${p}P${d}D" -v r="$rate" -F: '
                    { v = $2; gsub(/ /, "", v) }
                    /^P50 TTFT/ { t50 = v } /^P99 TTFT/ { t99 = v } /^P50 TPOT/ { p50 = v } /^P99 TPOT/ { p99 = v }
                    /^TTFT <=/ { it = v } /^TPOT <=/ { ip = v } /^All SLOs met/ { ia = v }
                    END { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s, r, t50, t99, p50, p99, it, ip, ia }'
            done
        done
    } >"$OUT/guide-mechanisms.md"
    rm -rf "$tmp"
}

if [ "$RUN" = 1 ]; then
    for name in "$@"; do
        # a disaggregation file runs its colocated configurations (its P:D split comes from
        # the search); every other file runs whole
        only=$(printf '%s\n' "$PD" | awk -F'|' -v n="$name" '$1 == n { print $6 }')
        if [ "$name" = guide-mechanisms ]; then
            mechanisms
        elif [ -n "$only" ]; then
            run_offline "$name" --only "$only"
        else
            run_offline "$name"
        fi
    done
fi

# ---- Tables and plots ------------------------------------------------------------------------

# The rows of a markdown table under heading $2 in file $1 (header and rule skipped), one per
# line, cells trimmed and separated by '|'.
table_rows() {
    awk -v h="$2" '
        index($0, h) == 1 { on = 1; n = 0; next }
        on && /^## / { exit }
        on && /^\|/ { if (++n > 2) { s = $0; sub(/^\| */, "", s); sub(/ *\| *$/, "", s)
                                     gsub(/ *\| */, "|", s); print s } }' "$1"
}

# The per-GPU goodput rows of one disaggregation report: kind|label|P|mean|half-width|budget|
# seeds that still passed at max_rate (the value is then a lower bound).
goodput_rows() {
    f=$OUT/$1/summary.md
    table_rows "$f" "## Per-GPU goodput" | awk -F'|' '{
        split($4, g, " ± "); b = $1; sub(/^colo-/, "", b)
        m = 0; s = $6; if (s ~ /still pass at max_rate/) { sub(/.*; /, "", s); m = s + 0 }
        print "colo|" $1 "|0|" g[1] "|" g[2] "|" b "|" m }'
    table_rows "$f" "## P:D search" | awk -F'|' '{
        split($6, g, " ± "); p = $1; sub(/P.*/, "", p)
        m = 0; s = $7; if (s ~ /still pass at max_rate/) { sub(/.*; /, "", s); m = s + 0 }
        print "pd|" $1 "|" p "|" g[1] "|" g[2] "||" m }'
}

# One plot of per-GPU goodput against P (prefill instances of 16) for the two SLO sets of a
# workload, colocated at its best budget as dashed lines: $1 workload key, $2 title.
plot_splits() {
    key=$1
    title=$2
    ni=$3
    for slo in tight loose; do
        [ -f "$OUT/guide-$key-$slo/summary.md" ] || continue
        goodput_rows "guide-$key-$slo" | sed "s/^/$slo|/"
    done | awk -F"|" -v title="$title" -v ni="$ni" '
        function x(p) { return L + p / ni * W }
        function y(v) { return T + H - v / ymax * H }
        { slo = $1; n = ++cnt[slo]; kind[slo, n] = $2; lab[slo, n] = $3; p[slo, n] = $4
          m[slo, n] = $5; h[slo, n] = $6; bud[slo, n] = $7; cap[slo, n] = $8
          if ($5 + $6 > top) top = $5 + $6 }
        END {
            L = 70; T = 50; W = 470; H = 300
            step = 0.1; if (top > 1) step = 0.25; if (top > 2) step = 0.5
            ymax = step * (int(top / step) + 1)
            col["tight"] = "#e15759"; col["loose"] = "#4e79a7"
            name["tight"] = "TTFT &lt;= 1 s, TPOT &lt;= 25 ms"; name["loose"] = "TTFT &lt;= 1.5 s, TPOT &lt;= 50 ms"
            printf "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" height=\"420\" viewBox=\"0 0 800 420\" font-family=\"sans-serif\">\n"
            printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            printf "<text x=\"400\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n", title
            printf "<g font-size=\"11\" fill=\"#333\">\n"
            for (v = 0; v <= ymax + 1e-9; v += step)
                printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L, y(v), L + W, y(v), L - 4, y(v) + 4, v
            for (q = 0; q <= ni; q += (ni > 8 ? 2 : 1))
                printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x(q), T, x(q), T + H, x(q), T + H + 14, q
            printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", L, T, W, H
            printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">prefill instances P of %d (D = %d - P), TP4 each</text>\n", L + W / 2, T + H + 32, ni, ni
            printf "<text x=\"24\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 24 %.1f)\">per-GPU goodput (req/s/GPU)</text>\n</g>\n", T + H / 2, T + H / 2
            ly = T + 10
            for (s = 1; s <= 2; s++) {
                slo = s == 1 ? "tight" : "loose"
                if (!(slo in cnt)) continue
                # the P:D splits, in order of P, with their intervals
                pts = ""; bestc = -1
                for (q = 1; q < ni; q++)
                    for (i = 1; i <= cnt[slo]; i++)
                        if (kind[slo, i] == "pd" && p[slo, i] == q) pts = pts sprintf("%.1f,%.1f ", x(q), y(m[slo, i]))
                printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", col[slo], pts
                for (i = 1; i <= cnt[slo]; i++) {
                    if (kind[slo, i] == "pd") {
                        printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", x(p[slo, i]), y(m[slo, i]), col[slo]
                        printf "<path d=\"M%.1f,%.1fV%.1f\" stroke=\"%s\"/>\n", x(p[slo, i]), y(m[slo, i] - h[slo, i]), y(m[slo, i] + h[slo, i]), col[slo]
                    } else if (bestc < 0 || m[slo, i] > m[slo, bestc]) bestc = i
                }
                if (bestc > 0) {
                    yy = y(m[slo, bestc])
                    printf "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\" fill-opacity=\"0.12\"/>\n", L, y(m[slo, bestc] + h[slo, bestc]), W, y(m[slo, bestc] - h[slo, bestc]) - y(m[slo, bestc] + h[slo, bestc]), col[slo]
                    printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"6 4\" stroke-width=\"2\"/>\n", L, yy, L + W, yy, col[slo]
                }
                printf "<g font-size=\"11\"><line x1=\"552\" y1=\"%d\" x2=\"576\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/><text x=\"582\" y=\"%d\">P:D splits, %s</text>\n", ly, ly, col[slo], ly + 4, slo
                printf "<line x1=\"552\" y1=\"%d\" x2=\"576\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"6 4\"/><text x=\"582\" y=\"%d\">colocated, budget %s%s</text>\n", ly + 18, ly + 18, col[slo], ly + 22, bud[slo, bestc], (cap[slo, bestc] > 0 ? " &gt;= (cap)" : "")
                printf "<text x=\"552\" y=\"%d\" fill=\"#555\">%s: %s</text></g>\n", ly + 40, slo, name[slo]
                ly += 64
            }
            printf "<text x=\"552\" y=\"%d\" font-size=\"10\" fill=\"#555\">bars and band: 95%% interval, 5 seeds</text>\n", ly
            printf "</svg>\n"
        }' >"$OUT/guide-splits-$key.svg"
    if command -v rsvg-convert >/dev/null 2>&1; then
        rsvg-convert -o "$OUT/guide-splits-$key.png" "$OUT/guide-splits-$key.svg"
    fi
}

# The decision table: per workload and SLO set, the best split, the best colocated budget, the
# shipped budget (2048) and the verdict (a tie when the 95% intervals overlap).
pd_table() {
    echo "| workload (prompt:output tokens) | GPUs | SLOs | best P:D split | per-GPU goodput | best colocated | per-GPU goodput | colocated, budget 2048 | split / best colocated | verdict |"
    echo "|---|---:|---|---|---:|---|---:|---:|---:|---|"
    printf "%s\n" "$PD" | while IFS="|" read -r name in out slo gpus colo; do
        [ -f "$OUT/$name/summary.md" ] || continue
        goodput_rows "$name" | awk -F"|" -v pin="$in" -v pout="$out" -v slo="$slo" -v gpus="$gpus" '
            $1 == "pd" && (bp == "" || $4 > bpm) { bp = $2; bpm = $4; bph = $5; bpx = $7 }
            $1 == "colo" && (bc == "" || $4 > bcm) { bc = $2; bcm = $4; bch = $5; bcx = $7 }
            $1 == "colo" && $6 == "2048" { c2 = ($7 > 0 ? ">= " : "") $4 " ± " $5 }
            END {
                sl = slo == "tight" ? "TTFT <= 1 s, TPOT <= 25 ms" : "TTFT <= 1.5 s, TPOT <= 50 ms"
                sub(/ tp4\/tp4/, "", bp)
                if (bpm - bph > bcm + bch) v = "disaggregation"
                else if (bcm - bch > bpm + bph) v = "colocated"
                else v = "tie (intervals overlap)"
                # a search that passed at max_rate gives a lower bound (marked >=)
                if (bpx > 0 || bcx > 0) v = v "; " (bpx > 0 ? bpx : bcx) " of 5 seeds passed at max_rate"
                printf "| %s:%s (%g:1) | %d | %s | %s | %s ± %s | %s | %s ± %s | %s | %.2fx | %s |\n",
                    pin, pout, pin / pout, gpus, sl, bp, (bpx > 0 ? ">= " : "") bpm, bph, bc,
                    (bcx > 0 ? ">= " : "") bcm, bch, c2, bpm / bcm, v }'
    done
}

# Mean ± half-width of the 95% interval (Student t) of columns of a report's results.csv, per
# configuration and rate: prints config|rate|seeds|mean ± hw|... for the columns named in $2
# (comma-separated; ratios in [0, 1] as percentages when the name ends in _pct: slo_attainment_pct).
csv_stats() {
    awk -F, -v want="$2" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; nw = split(want, w, ","); next }
        { k = $col["config"] SUBSEP $col["rate"]; if (!(k in n)) ord[++no] = k; n[k]++
          for (j = 1; j <= nw; j++) { c = w[j]; pct = sub(/_pct$/, "", c); v = $col[c] * (pct ? 100 : 1)
                                      s[k, j] += v; ss[k, j] += v * v } }
        END {
            split("12.706 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262", t, " ")
            for (i = 1; i <= no; i++) { k = ord[i]; split(k, kk, SUBSEP); line = kk[1] "|" kk[2] "|" n[k]
                for (j = 1; j <= nw; j++) { m = s[k, j] / n[k]; hw = 0
                    if (n[k] > 1) { var = (ss[k, j] - n[k] * m * m) / (n[k] - 1); if (var < 0) var = 0
                                    hw = (n[k] <= 10 ? t[n[k] - 1] : 1.96) * sqrt(var / n[k]) }
                    line = line "|" sprintf(m >= 100 ? "%.0f ± %.0f" : "%.2f ± %.2f", m, hw) }
                print line } }' "$1"
}

# The routing table: per configuration and rate, SLO attainment, goodput under both SLO sets,
# TTFT p50/p99 and the cached share of prompt tokens.
routing_table() {
    f=$OUT/$ROUTING/results.csv
    [ -f "$f" ] || return 0
    echo "| routing | rate (req/s) | seeds | SLO attainment (%), TTFT <= 1 s, TPOT <= 50 ms | goodput (req/s) | goodput, TTFT <= 1 s and TPOT <= 25 ms | TTFT p50 (ms) | TTFT p99 (ms) | cached prompt tokens (%) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    csv_stats "$f" slo_attainment_pct,request_goodput,goodput_slo2,ttft_p50_ms,ttft_p99_ms,cached_token_ratio_pct |
        awk -F'|' '{ printf "| %s |\n", $0 }' | sed 's/|/ | /g; s/^ | /| /; s/  */ /g'
}

# Colocated per-GPU goodput by token budget, per workload and SLO set (>= marks a lower bound).
budget_table() {
    echo "| workload | GPUs | SLOs | budget 256 | 512 | 1024 | 2048 |"
    echo "|---|---:|---|---:|---:|---:|---:|"
    printf "%s\n" "$PD" | while IFS="|" read -r name in out slo gpus colo; do
        [ -f "$OUT/$name/summary.md" ] || continue
        goodput_rows "$name" | awk -F"|" -v w="$in:$out" -v slo="$slo" -v gpus="$gpus" '
            $1 == "colo" { v[$6] = ($7 > 0 ? ">= " : "") $4 " ± " $5; if (best == "" || $4 > bm) { best = $6; bm = $4 } }
            END {
                sl = slo == "tight" ? "TTFT <= 1 s, TPOT <= 25 ms" : "TTFT <= 1.5 s, TPOT <= 50 ms"
                l = "| " w " | " gpus " | " sl " |"
                n = split("256 512 1024 2048", b, " ")
                for (i = 1; i <= n; i++) {
                    c = (b[i] in v) ? v[b[i]] : "-"
                    if (b[i] == best) c = "**" c "**"
                    l = l " " c " |"
                }
                print l }'
    done
}

# The rate sweep: per rate, each configuration's SLO attainment (%) under the tight set, and its
# goodput under both sets.
rates_table() {
    f=$OUT/$1/results.csv
    [ -f "$f" ] || return 0
    csv_stats "$f" slo_attainment_pct,request_goodput,goodput_slo2 | awk -F'|' '
        { if (!($1 in seen)) { seen[$1] = 1; cfg[++nc] = $1 }
          if (!($2 in seenr)) { seenr[$2] = 1; rate[++nr] = $2 }
          a[$1, $2] = $4; g[$1, $2] = $5; g2[$1, $2] = $6 }
        END {
            h = "| rate (req/s) |"; r = "|---:|"
            for (i = 1; i <= nc; i++) { h = h " " cfg[i] ": attainment (%) | goodput | goodput, loose SLOs |"; r = r "---:|---:|---:|" }
            print h; print r
            for (j = 1; j <= nr; j++) { l = "| " rate[j] " |"
                for (i = 1; i <= nc; i++) l = l " " a[cfg[i], rate[j]] " | " g[cfg[i], rate[j]] " | " g2[cfg[i], rate[j]] " |"
                print l } }'
}

# ---- The live cross-check ------------------------------------------------------------------

LIVE_FILE=guide-live-x8
if [ "$LIVE" = 1 ]; then
    [ -x "$TANDEM" ] || { echo "guide.sh: no tandem binary at $TANDEM (build first, or --tandem BIN)" >&2; exit 2; }
    for mode in live offline; do
        rm -rf "$OUT/$LIVE_FILE-$mode.tmp"
        echo "guide.sh: $LIVE_FILE $mode ($(date -u +%H:%M:%S) UTC)" >&2
        if [ "$mode" = live ]; then
            "$TANDEM" bench --experiment "deploy/experiments/$LIVE_FILE.yaml" \
                --out "$OUT/$LIVE_FILE-$mode.tmp" >"$OUT/$LIVE_FILE-$mode.log" 2>&1 || true
        else
            nice -n 10 "$TANDEM" bench --experiment "deploy/experiments/$LIVE_FILE.yaml" --offline \
                --out "$OUT/$LIVE_FILE-$mode.tmp" >"$OUT/$LIVE_FILE-$mode.log" 2>&1 || true
        fi
        [ -f "$OUT/$LIVE_FILE-$mode.tmp/results.csv" ] ||
            { echo "guide.sh: $LIVE_FILE $mode wrote no report, see $OUT/$LIVE_FILE-$mode.log" >&2; exit 1; }
        rm -rf "$OUT/$LIVE_FILE-$mode.tmp/requests" "$OUT/$LIVE_FILE-$mode.tmp/runs" \
            "$OUT/$LIVE_FILE-$mode.tmp/logs" "$OUT/$LIVE_FILE-$mode"
        mv "$OUT/$LIVE_FILE-$mode.tmp" "$OUT/$LIVE_FILE-$mode"
        rm -f "$OUT/$LIVE_FILE-$mode.log"
    done
fi

# Live against offline, per configuration and rate: SLO attainment (%) and TTFT/TPOT p50.
live_table() {
    [ -f "$OUT/$LIVE_FILE-live/results.csv" ] && [ -f "$OUT/$LIVE_FILE-offline/results.csv" ] || return 0
    echo "| config | rate (req/s) | SLO attainment (%): live | offline | TTFT p50 (ms): live | offline | TPOT p50 (ms): live | offline |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    { csv_stats "$OUT/$LIVE_FILE-live/results.csv" slo_attainment_pct,ttft_p50_ms,tpot_p50_ms | sed 's/^/L|/'
      csv_stats "$OUT/$LIVE_FILE-offline/results.csv" slo_attainment_pct,ttft_p50_ms,tpot_p50_ms | sed 's/^/O|/'
    } | awk -F'|' '
        $1 == "L" { k = $2 "|" $3; ord[++n] = k; la[k] = $5 " (" $4 " seeds)"; lt[k] = $6; lp[k] = $7 }
        $1 == "O" { k = $2 "|" $3; oa[k] = $5 " (" $4 " seeds)"; ot[k] = $6; op[k] = $7 }
        END { for (i = 1; i <= n; i++) { k = ord[i]; split(k, kk, "|")
              printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", kk[1], kk[2], la[k], oa[k], lt[k], ot[k], lp[k], op[k] } }'
}

# ---- guide.md ---------------------------------------------------------------------------------

for key in prefill-heavy balanced decode-heavy; do
    case $key in
    prefill-heavy) t="4096:64-token requests, 64 H100s"; ni=16 ;;
    balanced) t="1024:256-token requests, 64 H100s"; ni=16 ;;
    *) t="128:512-token requests, 16 H100s"; ni=4 ;;
    esac
    if [ -f "$OUT/guide-$key-tight/summary.md" ] || [ -f "$OUT/guide-$key-loose/summary.md" ]; then
        plot_splits "$key" "Llama-3-70B, $t: per-GPU goodput by P:D split" "$ni"
    fi
done
{
    echo "# The decision guide's numbers"
    echo
    echo "Written by \`bench/experiments/guide.sh\` from the reports beside it (docs/experiments.md explains them)."
    echo "Per-GPU goodput: the highest rate at which 90% of requests meet both SLOs, per GPU, mean ± 95% interval over 5 seeds."
    echo
    echo "## Disaggregated (best P:D split) against colocated (best token budget)"
    echo
    pd_table
    echo
    echo "## Colocated per-GPU goodput by token budget (best in bold)"
    echo
    budget_table
    echo
    for key in prefill-heavy balanced decode-heavy; do
        [ -f "$OUT/guide-splits-$key.svg" ] && echo "![$key](guide-splits-$key.svg)"
    done
    r=$(rates_table "$RATES")
    if [ -n "$r" ]; then
        echo
        echo "## The prefill-heavy case by rate (TTFT <= 1 s, TPOT <= 25 ms; loose: TTFT <= 1.5 s, TPOT <= 50 ms)"
        echo
        printf "%s\n" "$r"
        echo
        echo "![attainment]($RATES/attainment.svg)"
    fi
    r=$(rates_table "$BRATES")
    if [ -n "$r" ]; then
        echo
        echo "## The balanced case past 128 req/s (TTFT <= 1 s, TPOT <= 25 ms; loose: TTFT <= 1.5 s, TPOT <= 50 ms)"
        echo
        printf "%s\n" "$r"
    fi
    r=$(routing_table)
    if [ -n "$r" ]; then
        echo
        echo "## Prefix-aware routing, 256 instances (1,024 GPUs)"
        echo
        printf '%s\n' "$r"
    fi
    l=$(live_table)
    if [ -n "$l" ]; then
        echo
        echo "## Live against offline, 8 instances"
        echo
        printf '%s\n' "$l"
    fi
} >"$OUT/guide.md"
echo "guide.sh: wrote $OUT/guide.md" >&2
