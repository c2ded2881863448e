-- wrk script for the router throughput benchmark (bench/router/throughput.sh):
-- short non-streaming completions, one POST per request on keep-alive
-- connections. Override the body with WRK_BODY, e.g.
--   WRK_BODY='{"prompt":"hi","max_tokens":1}' wrk -s completions.lua ...
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("WRK_BODY") or
    '{"model":"llama-3-8b","prompt":"Tandem routes this short prompt.","max_tokens":4,"temperature":0}'

-- One summary line that scripts can parse, after wrk's own report.
done = function(summary, latency, requests)
    local secs = summary.duration / 1e6
    local errors = summary.errors.connect + summary.errors.read + summary.errors.write +
        summary.errors.status + summary.errors.timeout
    io.write(string.format(
        "RESULT requests=%d seconds=%.2f rps=%.0f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f " ..
        "max_ms=%.3f errors=%d non2xx=%d\n",
        summary.requests, secs, summary.requests / secs,
        latency:percentile(50) / 1e3, latency:percentile(90) / 1e3,
        latency:percentile(99) / 1e3, latency.max / 1e3, errors, summary.errors.status))
end
