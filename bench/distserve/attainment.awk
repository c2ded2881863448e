# results.csv of an experiment report -> a markdown table of SLO attainment (%) by per-GPU rate
# (rate / g), one column per configuration, and a last row with each configuration's per-GPU
# goodput at 90% attainment: the first crossing of 90% between two adjacent rates, linearly
# interpolated (DistServe's find_intersection); "> max" when it never falls below 90%, "< min"
# when it starts below.
NR == 1 {
    for (i = 1; i <= NF; i++) col[$i] = i
    next
}
{
    c = $col["config"]; r = $col["rate"] / g
    if (!(c in seen)) { seen[c] = 1; cfgs[++nc] = c }
    if (!(r in rseen)) { rseen[r] = 1; rates[++nr] = r }
    att[c, r] = $col["slo_attainment"] * 100
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
            if ((cfgs[k], rates[i]) in att) printf " %.1f |", att[cfgs[k], rates[i]]
            else printf " |"
        }
        printf "\n"
    }
    printf "| **goodput @ 90%%** |"
    for (k = 1; k <= nc; k++) {
        c = cfgs[k]; out = ""
        for (i = 1; i < nr && out == ""; i++) {
            y0 = att[c, rates[i]]; y1 = att[c, rates[i + 1]]
            if ((y0 < 90) != (y1 < 90))
                out = sprintf("%.4g", (90 - y0) * (rates[i + 1] - rates[i]) / (y1 - y0) + rates[i])
        }
        if (out == "") out = (att[c, rates[1]] >= 90) ? "> " rates[nr] : "< " rates[1]
        printf " **%s** |", out
    }
    printf "\n"
}
