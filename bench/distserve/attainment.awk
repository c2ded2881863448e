# results.csv of an experiment report -> a markdown table of SLO attainment (%) by per-GPU rate
# (rate / g), one column per configuration (the mean over the seeds), and a last row with each
# configuration's per-GPU goodput at 90% attainment: per seed, the first crossing of 90% between
# two adjacent rates, linearly interpolated (DistServe's find_intersection), then the mean over
# the seeds +- the 95% confidence half-width (Student t, n - 1 degrees of freedom); "> max" when
# some seed never falls below 90%, "< min" when some seed starts below.
function tcrit(df) {   # two-sided 95%
    if (df < 1) return 0
    if (df <= 10) {
        split("12.706 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262 2.228", tt, " ")
        return tt[df] + 0
    }
    return df <= 30 ? 2.042 : 1.96
}
NR == 1 {
    for (i = 1; i <= NF; i++) col[$i] = i
    next
}
{
    c = $col["config"]; r = $col["rate"] / g; s = $col["seed"]
    if (!(c in seen)) { seen[c] = 1; cfgs[++nc] = c }
    if (!(r in rseen)) { rseen[r] = 1; rates[++nr] = r }
    if (!((c, s) in sseen)) { sseen[c, s] = 1; seeds[c, ++ns[c]] = s }
    a = $col["slo_attainment"] * 100
    att[c, r, s] = a; sum[c, r] += a; cnt[c, r]++
}
END {
    for (i = 1; i <= nr; i++)       # rates ascending (insertion sort; a handful)
        for (j = i; j > 1 && rates[j - 1] + 0 > rates[j] + 0; j--) {
            t = rates[j]; rates[j] = rates[j - 1]; rates[j - 1] = t
        }
    printf "| per-GPU rate |"
    for (k = 1; k <= nc; k++) printf " %s |", cfgs[k]
    printf "\n|---:|"
    for (k = 1; k <= nc; k++) printf "---:|"
    printf "\n"
    for (i = 1; i <= nr; i++) {
        printf "| %g |", rates[i]
        for (k = 1; k <= nc; k++) {
            if ((cfgs[k], rates[i]) in cnt) printf " %.1f |", sum[cfgs[k], rates[i]] / cnt[cfgs[k], rates[i]]
            else printf " |"
        }
        printf "\n"
    }
    printf "| **goodput @ 90%%** (mean +- 95%% CI over seeds) |"
    for (k = 1; k <= nc; k++) {
        c = cfgs[k]; above = 0; below = 0; n = 0; m = 0; q = 0
        for (j = 1; j <= ns[c]; j++) {
            s = seeds[c, j]; x = ""
            for (i = 1; i < nr && x == ""; i++) {
                y0 = att[c, rates[i], s]; y1 = att[c, rates[i + 1], s]
                if ((y0 < 90) != (y1 < 90))
                    x = (90 - y0) * (rates[i + 1] - rates[i]) / (y1 - y0) + rates[i]
            }
            if (x == "") { if (att[c, rates[1], s] >= 90) above++; else below++; continue }
            n++; d = x - m; m += d / n; q += d * (x - m)
        }
        if (above) out = "> " rates[nr] (above < ns[c] ? sprintf(" (%d of %d seeds)", above, ns[c]) : "")
        else if (below) out = "< " rates[1] (below < ns[c] ? sprintf(" (%d of %d seeds)", below, ns[c]) : "")
        else if (n > 1) out = sprintf("%.3g +- %.2g", m, tcrit(n - 1) * sqrt(q / (n - 1)) / sqrt(n))
        else out = sprintf("%.3g", m)
        printf " **%s** |", out
    }
    printf "\n"
}
