/* The router's live page: see index.html and docs/api.md ("Dashboard").
 *
 * Every POLL_MS it reads three of the router's own endpoints, one request
 * each, and redraws:
 *   GET /v1/cluster                  workers (role, health, load, KV, counters)
 *   GET /v1/decisions?limit=&candidates=   the last DECISIONS records, each
 *                                    profile run cut to its CANDIDATES best
 *   GET /metrics                     request counter, TTFT and TPOT histograms
 * so one poll's size is bounded by the number of workers, not by the request
 * rate. Rates and percentiles come from the difference between this poll's
 * counters and those of a poll about WINDOW_MS ago (histogram_quantile's
 * interpolation inside a bucket). A poll is never started while one runs.
 * The page measures its own cost per poll (bytes, fetch and render time) in
 * the footer, whose data- attributes scripts/dashboard-cost.sh reads. */
'use strict';

(function () {
  const POLL_MS = 1000;
  const WINDOW_MS = 60000; /* tiles: the last minute */
  const SHORT_MS = 10000; /* per-worker picks/s and prefix hits */
  const DECISIONS = 20;
  const CANDIDATES = 3;
  const KEY_ITEM = 'tandem-api-key';

  let key = sessionStorage.getItem(KEY_ITEM) || '';
  /* dashboard#key=KEY: the key from the address (a fragment never reaches
   * the server), then taken out of it. */
  const fromHash = /(?:^#|&)key=([^&]*)/.exec(location.hash);
  if (fromHash) {
    key = decodeURIComponent(fromHash[1]);
    sessionStorage.setItem(KEY_ITEM, key);
    history.replaceState(null, '', location.pathname + location.search);
  }
  let samples = []; /* {t, req, dec, remote, local, ttft, itl, w: Map id -> counters} */
  const costs = []; /* the last 30 polls: {bytes, fetchMs, renderMs} */
  let polls = 0;
  let timer = null;

  const $ = (id) => document.getElementById(id);
  const ESC = {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'};
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);

  class AuthError extends Error {}
  class FetchError extends Error {}

  async function get(path) {
    const headers = key ? {Authorization: 'Bearer ' + key} : {};
    let r;
    try {
      r = await fetch(path, {headers: headers, cache: 'no-store'});
    } catch (e) {
      throw new FetchError('router unreachable (' + e.message + ')');
    }
    if (r.status === 401) {
      throw new AuthError(key ? 'the key was refused' : 'an API key is needed');
    }
    if (!r.ok) {
      throw new FetchError(path + ' answered HTTP ' + r.status);
    }
    return r.text();
  }

  /* ---- numbers ----------------------------------------------------------- */

  function fmt(v, digits) {
    if (!Number.isFinite(v)) return '–';
    return v.toFixed(digits);
  }

  /* A duration in seconds as "0.85 ms", "42 ms" or "4.8 s". */
  function fmtDur(s) {
    if (!Number.isFinite(s)) return '–';
    const ms = s * 1000;
    if (ms >= 1000) return s.toFixed(s >= 100 ? 0 : 1) + ' s';
    return (ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2)) + ' ms';
  }

  function fmtBytes(b) {
    if (!Number.isFinite(b)) return '–';
    const u = ['B', 'kB', 'MB', 'GB', 'TB'];
    let i = 0;
    while (b >= 1000 && i < u.length - 1) {
      b /= 1000;
      i++;
    }
    return (i ? b.toFixed(b >= 100 ? 0 : 1) : b.toFixed(0)) + ' ' + u[i];
  }

  function sampleValue(line) {
    return parseFloat(line.slice(line.lastIndexOf(' ') + 1));
  }

  function addBucket(map, line) {
    const i = line.indexOf('le="');
    if (i < 0) return;
    const le = line.slice(i + 4, line.indexOf('"', i + 4));
    const bound = le === '+Inf' ? Infinity : parseFloat(le);
    map.set(bound, (map.get(bound) || 0) + sampleValue(line));
  }

  /* The few series the page needs from the router's Prometheus text. */
  function parseMetrics(text) {
    let req = 0;
    const ttft = new Map(), itl = new Map();
    for (const line of text.split('\n')) {
      if (line.startsWith('tandem:router_requests_total{')) {
        req += sampleValue(line);
      } else if (line.startsWith('vllm:time_to_first_token_seconds_bucket{')) {
        addBucket(ttft, line);
      } else if (line.startsWith('vllm:inter_token_latency_seconds_bucket{')) {
        addBucket(itl, line);
      }
    }
    const sorted = (m) => [...m.entries()].sort((a, b) => a[0] - b[0]);
    return {req: req, ttft: sorted(ttft), itl: sorted(itl)};
  }

  /* Quantile q of the observations between two cumulative histograms (old
   * may be null: since the start), as Prometheus' histogram_quantile. */
  function quantile(q, now, old) {
    if (old && old.length !== now.length) old = null;
    const n = now.length;
    const count = (i) => now[i][1] - (old ? old[i][1] : 0);
    const total = n ? count(n - 1) : 0;
    if (!(total > 0)) return NaN;
    const rank = q * total;
    let lo = 0, below = 0;
    for (let i = 0; i < n; i++) {
      const c = count(i), le = now[i][0];
      if (c >= rank) {
        if (le === Infinity) return lo;
        return c > below ? lo + (le - lo) * (rank - below) / (c - below) : lo;
      }
      lo = le;
      below = c;
    }
    return NaN;
  }

  /* The oldest sample at most ms old, other than the newest; null if none. */
  function baseSince(ms) {
    const last = samples[samples.length - 1];
    for (let i = 0; i < samples.length - 1; i++) {
      if (last.t - samples[i].t <= ms) return samples[i];
    }
    return null;
  }

  /* ---- drawing ----------------------------------------------------------- */

  function setText(id, s) {
    const el = $(id);
    if (el.textContent !== s) el.textContent = s;
  }

  function setStatus(state, text) {
    const el = $('status');
    el.dataset.state = state;
    el.textContent = text;
  }

  function drawFacts(c) {
    let healthy = 0;
    for (const e of c.endpoints) healthy += e.healthy ? 1 : 0;
    const routing = String(c.routing).replace(/^.*\//, '');
    $('facts').innerHTML = 'model <b>' + esc(c.model) + '</b> · routing <b title="' +
      esc(c.routing) + '">' + esc(routing) + '</b> · block ' + esc(c.block_size) + ' · context ' + esc(c.max_context) + ' · <b>' +
      healthy + '</b> of ' + c.endpoints.length + ' workers healthy';
  }

  function drawLive(c) {
    const q = c.requests;
    setText('t-live', q.running + ' running');
    setText('t-live-sub', q.pending + ' waiting for a worker, ' + q.live + ' live in all');
  }

  function drawTiles(now, base) {
    const dt = base ? (now.t - base.t) / 1000 : NaN;
    const span = base ? 'last ' + Math.round(dt) + ' s' : 'since the router started';
    setText('t-rate', base ? fmt((now.req - base.req) / dt, 1) : '–');
    setText('t-rate-sub', base ? 'answered, ' + span : 'needs two polls');
    setText('t-dec', base ? fmt((now.dec - base.dec) / dt, 1) : '–');
    const remote = now.remote - (base ? base.remote : 0);
    const local = now.local - (base ? base.local : 0);
    setText('t-pd', remote + local > 0
      ? 'remote prefill ' + fmt(100 * remote / (remote + local), 0) + '%, ' + span
      : 'no P/D decision, ' + span);
    const pct = (h, oldh) => [0.5, 0.9, 0.99].map((q) => fmtDur(quantile(q, h, oldh))).join(' · ');
    setText('t-ttft', pct(now.ttft, base && base.ttft));
    setText('t-ttft-sub', span);
    setText('t-tpot', pct(now.itl, base && base.itl));
    setText('t-tpot-sub', 'inter-token latency, ' + span);
    let bytes = 0, total = 0;
    for (const [id, w] of now.w) {
      total += w.rx;
      const b = base && base.w.get(id);
      if (b && w.rx >= b.rx) bytes += w.rx - b.rx;
    }
    setText('t-kv', base ? fmtBytes(bytes / dt) + '/s' : '–');
    setText('t-kv-sub', fmtBytes(total) + ' installed on decode workers');
  }

  const ROLE_ORDER = {prefill: 0, decode: 1, colocated: 2};

  function kvBar(usage) {
    const p = Math.max(0, Math.min(1, usage || 0)) * 100;
    const cls = p >= 95 ? 'full' : p >= 80 ? 'hot' : '';
    return '<div class="bar"><i class="' + cls + '" style="width:' + p.toFixed(1) +
      '%"></i><span>' + p.toFixed(0) + '%</span></div>';
  }

  function drawWorkers(c, now, base) {
    const eps = c.endpoints.slice().sort((a, b) =>
      (ROLE_ORDER[a.role] - ROLE_ORDER[b.role]) ||
      a.id.localeCompare(b.id, undefined, {numeric: true}));
    const dt = base ? (now.t - base.t) / 1000 : NaN;
    const rows = [];
    for (const e of eps) {
      const w = now.w.get(e.id), b = base && base.w.get(e.id);
      const fresh = b && w.picks >= b.picks && w.q >= b.q;
      const picks = fresh ? fmt((w.picks - b.picks) / dt, 1) : '–';
      let hits;
      if (fresh && w.q > b.q) {
        hits = fmt(100 * (w.h - b.h) / (w.q - b.q), 0) + '%';
      } else if (e.prefix_cache && e.prefix_cache.hit_rate !== null) {
        hits = '<span class="dim" title="since the worker started">' +
          fmt(100 * e.prefix_cache.hit_rate, 0) + '%</span>';
      } else {
        hits = '–';
      }
      const health = e.healthy ? '<span class="health up">up</span>'
        : '<span class="health down">down</span>';
      const hb = e.last_heartbeat_ms_ago === null ? '–'
        : fmt(e.last_heartbeat_ms_ago / 1000, 1) + ' s';
      rows.push('<tr data-worker="' + esc(e.id) + '"><td class="id">' + esc(e.id) +
        '</td><td><span class="role ' + esc(e.role) + '">' + esc(e.role) + '</span></td><td>' +
        health + '</td><td class="n">' + e.load.waiting + '</td><td class="n">' + e.load.running +
        (e.max_running ? '<span class="dim"> / ' + e.max_running + '</span>' : '') +
        '</td><td>' + kvBar(e.kv.usage) + '</td><td class="n">' + hits + '</td><td class="n">' +
        picks + '</td><td class="n">' + e.inflight.requests + '</td><td class="n">' + hb +
        '</td></tr>');
    }
    $('workers').innerHTML = rows.join('');
    setText('w-count', eps.length + (c.unregistered_links.length
      ? ' (' + c.unregistered_links.length + ' links not registered)' : ''));
  }

  function shortScorer(name) {
    return name.replace(/-scorer$/, '');
  }

  function drawRun(run) {
    let s = '<div class="run"><b>' + esc(run.profile) + '</b>';
    const cands = run.candidates.slice().sort((a, b) => b.total - a.total);
    for (const cand of cands) {
      const parts = [];
      for (const k of Object.keys(cand.scores)) {
        parts.push(esc(shortScorer(k)) + ' ' + fmt(cand.scores[k], 2));
      }
      s += '<span class="cand' + (cand.endpoint === run.picked ? ' picked' : '') + '">' +
        esc(cand.endpoint) + ' ' + fmt(cand.total, 2) + ' <small>(' + parts.join(', ') +
        ')</small></span>';
    }
    const more = (run.candidates_total || run.candidates.length) - run.candidates.length;
    if (more > 0) s += '<span class="dim">+' + more + ' more</span>';
    return s + '</div>';
  }

  function drawDecisions(d) {
    const rows = [];
    for (const r of d.decisions) {
      const cached = r.actual_cached_decode !== null ? r.actual_cached_decode
        : r.predicted_cached_decode >= 0 ? '<span class="dim" title="predicted">' +
          r.predicted_cached_decode + '</span>' : '–';
      rows.push('<tr data-response="' + esc(r.response_id || '') + '"><td class="n">' + r.seq +
        '</td><td class="id">' + esc(r.response_id || '–') + '</td><td class="id">' +
        esc(r.decode || '–') + '</td><td class="id">' + esc(r.prefill || '–') +
        '</td><td><span class="pd ' + esc(r.pd) + '">' + esc(r.pd) + '</span></td><td class="nw">' +
        esc(r.reason) + '</td><td class="n">' + r.prompt_tokens + ' · ' + cached + '</td><td>' +
        r.runs.map(drawRun).join('') + '</td></tr>');
    }
    $('decisions').innerHTML = rows.join('');
    setText('d-count', d.decisions.length + ' newest of ' + d.total + ' (the router keeps ' +
      d.kept + ')');
  }

  function drawCost(bytes, fetchMs, renderMs) {
    costs.push({bytes: bytes, fetchMs: fetchMs, renderMs: renderMs});
    if (costs.length > 30) costs.shift();
    const mean = (f) => costs.reduce((a, c) => a + f(c), 0) / costs.length;
    const max = (f) => costs.reduce((a, c) => Math.max(a, f(c)), 0);
    const el = $('cost');
    el.dataset.polls = polls;
    el.dataset.bytesMean = mean((c) => c.bytes).toFixed(0);
    el.dataset.fetchMsMean = mean((c) => c.fetchMs).toFixed(2);
    el.dataset.renderMsMean = mean((c) => c.renderMs).toFixed(2);
    el.dataset.renderMsMax = max((c) => c.renderMs).toFixed(2);
    el.textContent = 'Poll ' + polls + ' every ' + POLL_MS / 1000 + ' s: ' + fmtBytes(bytes) +
      ', fetched in ' + fetchMs.toFixed(1) + ' ms, drawn in ' + renderMs.toFixed(1) +
      ' ms (mean of the last ' + costs.length + ': ' + fmtBytes(mean((c) => c.bytes)) + ', ' +
      mean((c) => c.renderMs).toFixed(1) + ' ms to draw).';
  }

  /* ---- one poll ---------------------------------------------------------- */

  function toSample(t, c, d, m) {
    const w = new Map();
    for (const e of c.endpoints) {
      w.set(e.id, {
        picks: e.picks || 0,
        q: e.prefix_cache ? e.prefix_cache.queries : 0,
        h: e.prefix_cache ? e.prefix_cache.hits : 0,
        rx: e.kv_transfer ? e.kv_transfer.bytes_received : 0,
      });
    }
    return {
      t: t, req: m.req, dec: c.decisions.total, remote: c.decisions.remote_prefill,
      local: c.decisions.local_prefill, ttft: m.ttft, itl: m.itl, w: w,
    };
  }

  async function poll() {
    const t0 = performance.now();
    let texts;
    try {
      texts = await Promise.all([
        get('/v1/cluster'),
        get('/v1/decisions?limit=' + DECISIONS + '&candidates=' + CANDIDATES),
        get('/metrics'),
      ]);
    } catch (e) {
      if (e instanceof AuthError) {
        askKey(e.message);
        return;
      }
      if (e instanceof FetchError) {
        setStatus('error', e.message + '; retrying');
        schedule();
        return;
      }
      throw e;
    }
    const t1 = performance.now();
    const c = JSON.parse(texts[0]);
    const d = JSON.parse(texts[1]);
    /* Server time: rates stay right however the browser schedules polls
     * (a background tab, a headless browser's virtual time). */
    const now = toSample(typeof c.now_ms === 'number' ? c.now_ms : Date.now(), c, d,
      parseMetrics(texts[2]));
    samples.push(now);
    while (samples.length > 2 && now.t - samples[0].t > WINDOW_MS + 5 * POLL_MS) samples.shift();
    polls++;
    drawFacts(c);
    drawLive(c);
    drawTiles(now, baseSince(WINDOW_MS));
    drawWorkers(c, now, baseSince(SHORT_MS));
    drawDecisions(d);
    setStatus('ok', 'live · ' + new Date().toLocaleTimeString());
    const bytes = texts.reduce((a, s) => a + s.length, 0);
    drawCost(bytes, t1 - t0, performance.now() - t1);
    schedule();
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(run, POLL_MS);
  }

  /* A failure that is not the network's or the key's is a bug of this page:
   * it goes to the console (the browser test fails on it) and the status. */
  function run() {
    poll().catch((e) => {
      setStatus('error', 'dashboard error: ' + e.message);
      console.error('dashboard:', e);
      schedule();
    });
  }

  /* ---- API key ----------------------------------------------------------- */

  function askKey(why) {
    setStatus('error', why);
    $('keyform').hidden = false;
    $('keyerr').textContent = key ? 'That key was refused.' : '';
    $('key').focus();
  }

  $('keyform').addEventListener('submit', (ev) => {
    ev.preventDefault();
    key = $('key').value.trim();
    sessionStorage.setItem(KEY_ITEM, key);
    $('keyform').hidden = true;
    samples = [];
    run();
  });

  run();
})();
