#!/bin/sh
# Prints calibration points (docs/calibration/points.csv format) for OPT-13B and OPT-66B on
# A100-80GB from DistServe's artifact: simdistserve/estimators/profile_data/
# profiler-a100-80g.distserve.json at github.com/LLMServe/DistServe commit 82831f1, the fits of
# step times DistServe's profiler measured on its own engine (ms):
#   prefill step = a + b * sum(len) + c * sum(len^2)                    ("prefill")
#   decode step  = a + b * sum(context + 1) + c * batch, with (a, b, c) from
#                  "decoding_smallbs" below batch 95, else "decoding_largebs"
# (simdistserve/estimators/time_estimator.py). The coefficients below are copied from that file
# (rounded to 6 significant digits). Each point evaluates a fit at one shape inside the profiled
# range (prompt plus output within OPT's 2,048 positions), so these are DistServe's measurements
# through its own regression, not raw readings: docs/engine.md says so beside the fit.
#
#   docs/calibration/distserve-points.sh >> docs/calibration/points.csv
#   docs/calibration/distserve-points.sh vllm    # the same shapes from profiler-a100-80g.vllm.json
#
# With `vllm`, the coefficients are those of the artifact's profile of its vLLM baseline (the
# fork the paper ran, same GPUs), ids prefixed dsv-: not calibration points of the default table
# (one engine per model and GPU), but the data for docs/calibration/distserve-vllm.csv, which
# gives the colocated baseline of docs/distserve.md the step times the paper's vLLM had.
set -eu
ENGINE=${1:-distserve}

# model tp | prefill a b c | decode-small a b c | decode-large a b c
COEF='opt-13b 1 18.1025 0.101912 7.12226e-06 19.9347 0.000626936 0.038507 7.16619 0.0005798 0.158311
opt-13b 2 14.743 0.0685772 2.44957e-06 13.2948 0.000341092 0.0629639 10.6387 0.000311834 0.0856291
opt-13b 4 12.0623 0.0380814 5.22625e-07 10.2562 0.000187867 0.0326927 10.4835 0.000171209 0.0456665
opt-66b 2 43.0588 0.274229 2.2478e-05 48.288 0.000942434 0.12755 28.7277 0.000474485 0.296178
opt-66b 4 29.4416 0.151352 8.31745e-06 30.7603 0.000451948 0.0632842 27.4708 0.000404685 0.124807
opt-66b 8 25.4907 0.106592 3.39105e-06 23.1551 0.000226915 0.0480064 21.7177 0.000375809 0.0897861'
# The same from profiler-a100-80g.vllm.json.
COEF_VLLM='opt-13b 1 22.0522 0.140509 8.07658e-06 23.475 0.000592934 0.0607269 20.2064 0.000490773 0.120003
opt-13b 2 27.4408 0.0905453 8.45205e-06 24.5406 0.000224401 0.0871579 17.9478 0.000457085 0.111791
opt-13b 4 30.5363 0.0515064 4.23247e-07 25.9011 7.75363e-05 0.0552809 23.8839 0.000284002 0.0627652
opt-66b 2 58.3822 0.382641 -7.11415e-06 57.0734 0.00364611 0.224937 26.9838 0.00620013 0.448257
opt-66b 4 42.9655 0.212866 4.60102e-05 39.5818 0.000694572 0.135809 40.8597 0.000426487 0.195084
opt-66b 8 38.9312 0.157368 4.53168e-06 31.176 0.000275565 0.067977 29.0878 0.000602772 0.138961'
PREFIX=ds
case $ENGINE in
distserve) ;;
vllm) COEF=$COEF_VLLM PREFIX=dsv ;;
*) echo "distserve-points.sh: engine is distserve (default) or vllm, not '$ENGINE'" >&2; exit 2 ;;
esac

SRC='DistServe artifact (LLMServe/DistServe@82831f1) simdistserve/estimators/profile_data/profiler-a100-80g.'$ENGINE'.json: fit of step times measured on '$ENGINE' (DistServe'"'"'s own engine or its vLLM baseline), A100-80GB SXM, FP16; evaluated by docs/calibration/distserve-points.sh'

printf '%s\n' "$COEF" | awk -v src="$SRC" -v prefix="$PREFIX" '
function pre(b, L) { return pa + pb * b * L + pc * b * L * L }
function dec(b, ctx) {
    if (b < 95) return sa + sb * b * (ctx + 1) + sc * b
    return la + lb * b * (ctx + 1) + lc * b
}
function emit(kind, b, len, ms) {
    n++
    printf prefix "-%s-tp%d-%s-b%d-%d,%s,a100-80g,%d,%d,%d,1,%s,%.1f,%s\n", \
        substr(model, 5), tp, substr(kind, 1, 3), b, len, model, tp, b, len, kind, ms, src
}
{
    model = $1; tp = $2; pa = $3; pb = $4; pc = $5
    sa = $6; sb = $7; sc = $8; la = $9; lb = $10; lc = $11
    split("128 512 1024 2000", lens, " ")
    for (i = 1; i <= 4; i++) emit("prefill", 1, lens[i], pre(1, lens[i]))
    emit("prefill", 4, 512, pre(4, 512))
    split("1 16 64 128", bs, " ")
    for (i = 1; i <= 4; i++) emit("decode", bs[i], 512, dec(bs[i], 512))
    emit("decode", 64, 1536, dec(64, 1536))
}'
