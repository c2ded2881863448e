# requests/<config>-r<rate>.csv of an experiment report -> one markdown row: the share (%) of
# requests with TTFT <= ttft * s and TPOT <= tpot * s for each scale s in `scales` (failed
# requests count as misses), as DistServe's SLO-scale plots; the first printed lines are the
# header, which run.sh keeps once.
BEGIN { ns = split(scales, sc, " ") }
NR == 1 {
    for (i = 1; i <= NF; i++) col[$i] = i
    next
}
{
    n++
    if ($col["ok"] != 1) next
    for (k = 1; k <= ns; k++)
        if ($col["ttft_ms"] <= ttft * sc[k] && $col["tpot_ms"] <= tpot * sc[k]) good[k]++
}
END {
    printf "| config |"
    for (k = 1; k <= ns; k++) printf " x%s |", sc[k]
    printf "\n|---|"
    for (k = 1; k <= ns; k++) printf "---:|"
    printf "\n| %s |", c
    for (k = 1; k <= ns; k++) printf " %.1f |", n ? 100 * good[k] / n : 0
    printf "\n"
}
