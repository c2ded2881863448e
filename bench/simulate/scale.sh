#!/bin/sh
# The offline simulator's cost against cluster size (issue 14, docs/performance.md
# "Offline simulator"): simulated Llama-3-70B TP4 instances on H100, colocated and
# disaggregated (half prefill, half decode), under SGLang's shared-prefix workload at
# a load per instance held fixed, so that requests per instance stay the same.
#
#   bench/simulate/scale.sh [BIN_DIR] [SIZES] [REQUESTS_PER_INSTANCE] [RATE_PER_INSTANCE]
#
# Defaults: build/bin, "16 64 256 1024", 390 (100k requests at 256 instances), 2 req/s.
# Prints one line per run: variant, instances, GPUs, requests, CPU s (user + sys: the
# run is one thread, so on an idle core this is its wall time; other load on the machine
# does not inflate it), wall s, max RSS MiB,
# modelled s per wall s, events per wall s, CPU us per request, router us per request
# (taking it; its worker messages), and the run's completed count and TTFT/TPOT p50.
set -eu
BIN=${1:-build/bin}
SIZES=${2:-"16 64 256 1024"}
PER=${3:-390}
RATE=${4:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
ROUTING=$(cd "$HERE/../../deploy/routing" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

jget() { # key file: a number of the --json output (one key per line)
    sed -n "s/^ *\"$1\": \([^,]*\),\{0,1\}\$/\1/p" "$2"
}

cluster() { # variant n file
    if [ "$1" = colocated ]; then
        cat > "$3" <<YAML
name: scale-colocated-$2
model: llama-3-70b
backend: sim
block_size: 16
routing: $ROUTING/prefix-aware-precise.yaml
pools:
  colocated:
    count: $2
    gpu: h100-sxm
    tp: 4
    kv_dtype: bf16
    max_running: 256
    token_budget: 2048
    max_prefill_chunk: 2048
YAML
    else
        cat > "$3" <<YAML
name: scale-pd-$2
model: llama-3-70b
backend: sim
block_size: 16
routing: $ROUTING/pd-prefix-precise.yaml
pools:
  prefill:
    count: $(($2 / 2))
    gpu: h100-sxm
    tp: 4
    link: ib-400g
    kv_dtype: bf16
    token_budget: 8192
  decode:
    count: $(($2 / 2))
    gpu: h100-sxm
    tp: 4
    link: ib-400g
    kv_dtype: bf16
    max_running: 256
YAML
    fi
}

printf '%-9s %5s %5s %7s %7s %8s %7s %8s %9s %8s %15s %6s %9s %9s\n' variant inst gpus requests cpu_s \
    wall_s rss_mib mod/wall events/s us/req "router_us(take;msg)" ok ttft_p50 tpot_p50
for n in $SIZES; do
    for v in colocated pd; do
        f="$TMP/$v-$n.yaml"
        cluster "$v" "$n" "$f"
        reqs=$((PER * n))
        rate=$((RATE * n))
        /usr/bin/time -f '%e %M %U %S' -o "$TMP/time" "$BIN/tandem" simulate -c "$f" --sim-stats \
            --dataset-name shared-prefix --num-prompts "$reqs" --request-rate "$rate" \
            --seed 1 --json "$TMP/out.json" > /dev/null 2> "$TMP/err" || {
            cat "$TMP/err" >&2
            exit 1
        }
        set -- $(cat "$TMP/time")
        wall=$1
        rss=$(($2 / 1024))
        cpu=$(awk -v u="$3" -v s="$4" 'BEGIN { printf "%.2f", u + s }')
        stats=$(grep '^simulate:' "$TMP/err")
        ratio=$(echo "$stats" | sed -n 's/.* wall s (\([0-9.]*\)x).*/\1/p')
        evs=$(echo "$stats" | sed -n 's/.* events (\([0-9]*\)\/s).*/\1/p')
        take=$(echo "$stats" | sed -n 's/.*router \([0-9.]*\) us per request taking.*/\1/p')
        msg=$(echo "$stats" | sed -n 's/.*taking it, \([0-9.]*\) us per request in.*/\1/p')
        ok=$(jget completed "$TMP/out.json")
        ttft=$(awk -v x="$(jget median_ttft_ms "$TMP/out.json")" 'BEGIN { printf "%.1f", x }')
        tpot=$(awk -v x="$(jget median_tpot_ms "$TMP/out.json")" 'BEGIN { printf "%.1f", x }')
        usreq=$(awk -v c="$cpu" -v n="$reqs" 'BEGIN { printf "%.1f", c / n * 1e6 }')
        printf '%-9s %5d %5d %7d %7s %8s %7d %8s %9s %8s %15s %6s %9s %9s\n' "$v" "$n" $((4 * n)) \
            "$reqs" "$cpu" "$wall" "$rss" "$ratio" "$evs" "$usreq" "$take;$msg" "$ok" "$ttft" "$tpot"
    done
done
