// tinybroker console. Plain ES2020, no dependencies. Every string from the
// server goes into the DOM through textContent / text nodes, never as HTML.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const DASH = '—';
  const SVGNS = 'http://www.w3.org/2000/svg';

  // h('td', {class: 'x', text: 'y', data: {id}}, child, ...): strings become text nodes.
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = String(v);
      else if (k === 'data') Object.assign(el.dataset, v);
      else if (k === 'hidden') el.hidden = true;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of kids.flat()) if (c != null && c !== false) el.append(c instanceof Node ? c : String(c));
    return el;
  }
  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    el.append(...kids);
    return el;
  }

  // ---- formatting -------------------------------------------------------
  function dur(ms) {
    let s = Math.max(0, Math.floor(ms / 1000));
    if (s < 60) return s + ' s';
    let m = Math.floor(s / 60); s %= 60;
    if (m < 60) return m + ' min' + (s ? ' ' + s + ' s' : '');
    let hr = Math.floor(m / 60); m %= 60;
    if (hr < 24) return hr + ' h' + (m ? ' ' + m + ' min' : '');
    const d = Math.floor(hr / 24); hr %= 24;
    return d + ' d' + (hr ? ' ' + hr + ' h' : '');
  }
  const ago = (ms, now) => (ms == null ? DASH : dur(now - ms) + ' ago');
  // The server's clock, as of the last event: relative times move on between events (the
  // server sends one only when something changed), against the server's clock, not ours.
  let server = { now: 0, at: 0 };
  const serverNow = () => server.now + (performance.now() - server.at);
  setInterval(() => {
    if (!server.at) return;
    const now = serverNow();
    for (const el of document.querySelectorAll('[data-ago]')) {
      el.textContent = ago(Number(el.dataset.ago), now);
    }
    for (const el of document.querySelectorAll('[data-for]')) {
      el.textContent = 'for ' + dur(now - Number(el.dataset.for));
    }
  }, 1000);
  const pad = (n) => String(n).padStart(2, '0');
  function clock(ms) {
    if (ms == null) return '';
    const d = new Date(ms);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  const hms = (ms) => clock(ms).slice(11);
  function rate(x) {
    if (x == null || !isFinite(x)) return DASH;
    return x >= 100 ? x.toFixed(0) : x.toFixed(1);
  }
  function bytes(n) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(n < 10 ? 1 : 0) : n) + ' ' + u[i];
  }
  // The elements for `items`, reusing each current child whose data did not change (same
  // key, same signature), so a click, a hover or a selection is not lost to an update.
  function keep(container, items, key, build) {
    const old = new Map();
    for (const el of container.children) if (el.dataset.key != null) old.set(el.dataset.key, el);
    return items.map((item) => {
      const k = key(item), sig = JSON.stringify(item);
      const prev = old.get(k);
      if (prev && prev.dataset.sig === sig) return prev;
      const el = build(item);
      el.dataset.key = k;
      el.dataset.sig = sig;
      return el;
    });
  }
  const mono = (t, cls) => h('span', { class: 'mono' + (cls ? ' ' + cls : ''), text: t });

  // ---- routing -----------------------------------------------------------
  const subHash = (id) => '#/subscriptions/' + encodeURIComponent(id);
  const overviewHash = (q, page) =>
    !q && page <= 1 ? '#/' : '#/?' + (q ? 'q=' + encodeURIComponent(q) + '&' : '') + 'page=' + page;

  function parseHash() {
    const x = location.hash.replace(/^#/, '');
    const P = '/subscriptions/';
    if (x.startsWith(P) && x.length > P.length) {
      const raw = x.slice(P.length);
      let id = raw;
      try { id = decodeURIComponent(raw); } catch (_) { /* keep raw */ }
      return { view: 'subscription', id };
    }
    const i = x.indexOf('?');
    const p = new URLSearchParams(i >= 0 ? x.slice(i + 1) : '');
    return { view: 'overview', q: p.get('q') || '', page: Math.max(1, parseInt(p.get('page'), 10) || 1) };
  }

  let cur = { view: null };
  let lastOverview = '#/';
  let keepResult = false;

  function route() {
    const r = parseHash();
    if (!keepResult) setResult('', '');
    keepResult = false;
    const prev = cur;
    cur = r;
    const ov = $('overview');
    if (r.view === 'overview') {
      lastOverview = overviewHash(r.q, r.page);
      $('sub-view').replaceChildren();
      ov.hidden = false;
      if (document.activeElement !== $('search')) $('search').value = r.q;
      if (prev.view !== 'overview' || prev.q !== r.q || prev.page !== r.page) {
        connect(`/api/stream?view=overview&q=${encodeURIComponent(r.q)}&page=${r.page}`,
          `/api/overview?q=${encodeURIComponent(r.q)}&page=${r.page}`);
      }
    } else if (prev.view !== 'subscription' || prev.id !== r.id) {
      ov.hidden = true;
      $('sub-view').replaceChildren(buildSub(r.id));
      connect(`/api/stream?view=subscription&id=${encodeURIComponent(r.id)}`,
        `/api/subscriptions/${encodeURIComponent(r.id)}`);
    }
  }

  // ---- live stream ---------------------------------------------------------
  let es = null;
  let retryTimer = 0;
  let retryDelay = 1000;

  function setStatus(live) {
    const s = $('status');
    s.textContent = live ? 'live' : 'disconnected';
    s.className = 'badge ' + (live ? 'live' : 'down');
    document.body.classList.toggle('stale', !live);
  }

  function connect(url, restUrl) {
    if (es) es.close();
    clearTimeout(retryTimer);
    setStatus(false);
    const src = new EventSource(url);
    es = src;
    const on = (name, fn) => src.addEventListener(name, (e) => {
      if (es !== src) return;
      setStatus(true);
      let d;
      try { d = JSON.parse(e.data); } catch (_) { return; }
      if (typeof d.now_ms === 'number') server = { now: d.now_ms, at: performance.now() };
      fn(d);
    });
    src.onopen = () => { if (es === src) { setStatus(true); retryDelay = 1000; } };
    src.onerror = () => {
      if (es !== src) return;
      setStatus(false);
      // EventSource retries by itself unless the response was not a stream
      // (HTTP error): then retry by hand, and ask the REST endpoint why.
      if (src.readyState === EventSource.CLOSED) {
        retryTimer = setTimeout(() => { if (es === src) connect(url, restUrl); }, retryDelay);
        retryDelay = Math.min(retryDelay * 2, 15000);
        probe(src, restUrl);
      }
    };
    on('overview', renderOverview);
    on('subscription', renderSub);
    on('gone', renderGone);
  }

  async function probe(src, url) {
    try {
      const r = await fetch(url, { credentials: 'same-origin' });
      const d = await r.json();
      if (es !== src) return;
      if (r.ok) (cur.view === 'overview' ? renderOverview : renderSub)(d);
      else if (cur.view === 'subscription' && r.status === 404) renderGone(d);
      else if (r.status >= 400 && r.status < 500 && r.status !== 401 && r.status !== 429) {
        // Refused for good (an id the broker does not take): say why, and stop asking.
        clearTimeout(retryTimer);
        setResult('error', (d && d.error) ? d.error : 'refused (' + r.status + ')');
      }
    } catch (_) { /* still disconnected; the badge says so */ }
  }

  function setMeta(d) {
    $('read-only').hidden = !d.read_only;
    if (d.deployment === 'embedded') $('deployment').textContent = 'embedded broker';
    else if (d.deployment === 'gateway') {
      const g = d.gateway;
      // A subscription's page carries no gateway figures: it says "gateway" until the
      // overview's have been seen.
      if (g) $('deployment').textContent = `gateway ${g.id} · ${g.nats} · stream ${g.stream} · ${g.gateways} gateway${g.gateways === 1 ? '' : 's'}`;
      else if (!$('deployment').textContent) $('deployment').textContent = 'gateway';
    }
  }

  // ---- overview ------------------------------------------------------------
  function memFig(m) {
    if (!m) return DASH;
    const t = m.limit > 0 ? `${bytes(m.used)} / ${bytes(m.limit)} (${Math.round((100 * m.used) / m.limit)}%)` : bytes(m.used);
    return m.limit > 0 ? [t, h('meter', { min: 0, max: m.limit, value: Math.min(m.used, m.limit), high: m.limit * 0.8 })] : t;
  }

  function renderOverview(d) {
    if (cur.view !== 'overview') return;
    setMeta(d);
    const b = d.broker || {};
    const figs = [
      ['subscriptions', b.subscriptions], ['connections', b.connections], ['members', b.members],
      ['publish rate', rate(b.publish_rate) + ' /s'], ['memory', memFig(b.memory)],
      ['drop-oldest memory', memFig(b.drop_oldest_memory)], ['storage', b.storage, 'wide'],
    ];
    $('broker').replaceChildren(...figs.map(([k, v, cls]) =>
      h('div', { class: 'fig ' + (cls || '') }, h('dt', { text: k }), h('dd', {}, v == null ? DASH : v))));

    const now = d.now_ms;
    const rows = keep($('subscriptions').tBodies[0], d.subscriptions || [], (r) => r.id, (r) => overviewRow(r, now));
    if (!rows.length) {
      rows.push(h('tr', { class: 'empty' }, h('td', { colspan: 12, text: d.q ? `no subscription matches “${d.q}”` : 'no subscriptions' })));
    }
    $('subscriptions').tBodies[0].replaceChildren(...rows);
    $('total').textContent = d.total == null ? '' : `(${d.total}${d.q ? ' matching' : ''})`;
    const page = d.page || 1;
    const pages = Math.max(1, d.pages || 1);
    $('page-info').textContent = `page ${page} of ${pages}`;
    $('prev').disabled = page <= 1;
    $('next').disabled = page >= pages;
  }

  function overviewRow(r, now) {
    const a = r.active;
    const counts = [['redelivered', r.redelivered], ['dead-lettered', r.dead_lettered], ['dropped', r.dropped], ['refused', r.refused]]
      .filter(([, v]) => v);
    return h('tr', { data: { id: r.id }, class: a ? '' : 'no-active' },
      h('td', { class: 'id' }, h('a', { href: subHash(r.id), class: 'mono', text: r.id })),
      h('td', { class: 'mode' }, h('span', { class: 'pill mode-' + r.mode, text: r.mode })),
      h('td', { class: 'group', text: r.group || DASH }),
      h('td', { class: 'patterns mono', text: (r.patterns || []).join(' ') }),
      h('td', { class: 'members num', text: r.members }),
      h('td', { class: 'active', title: a && a.gateway ? 'through gateway ' + a.gateway : null },
        a ? [mono(a.member, 'member-id'), a.metadata ? ' · ' + a.metadata : ''] : DASH),
      h('td', { class: 'epoch mono', text: a ? a.epoch : DASH }),
      h('td', { class: 'since', title: a ? clock(a.since_ms) : null, text: a ? ago(a.since_ms, now) : DASH,
        data: a && a.since_ms != null ? { ago: a.since_ms } : null }),
      h('td', { class: 'depth num', text: r.depth }),
      h('td', { class: 'inflight num', text: r.in_flight }),
      h('td', { class: 'rates num', text: `${rate(r.publish_rate)} · ${rate(r.ack_rate)}` }),
      h('td', { class: 'counts' + (r.dead_lettered || r.dropped || r.refused ? ' warn' : ''),
        text: counts.length ? counts.map(([k, v]) => `${v} ${k}`).join(' · ') : DASH }));
  }

  // ---- subscription page ---------------------------------------------------
  function buildSub(id) {
    const num = ['pos', 'priority', 'in flight'];
    const th = (...names) => h('thead', {}, h('tr', {}, names.map((n) => h('th', { class: num.includes(n) ? 'num' : null, text: n }))));
    return h('section', { id: 'subscription', data: { id } },
      h('p', { class: 'crumbs' }, h('a', { href: lastOverview, text: '← all subscriptions' })),
      h('div', { class: 'sub-title' },
        h('h2', {}, mono(id, 'sub-id')),
        h('span', { id: 'sub-mode', class: 'pill' }),
        h('div', { id: 'actions' })),
      h('p', { id: 'sub-gone', class: 'banner', hidden: true }),
      h('div', { class: 'sub-grid' },
        h('dl', { class: 'figs activebox' },
          h('div', { class: 'fig' }, h('dt', { text: 'active member' }), h('dd', { id: 'sub-active-member', class: 'mono' })),
          h('div', { class: 'fig' }, h('dt', { text: 'epoch' }), h('dd', { id: 'sub-epoch', class: 'mono' })),
          h('div', { class: 'fig' }, h('dt', { text: 'since' }), h('dd', { id: 'sub-since' })),
          h('div', { class: 'fig wide' }, h('dt', { text: 'metadata' }), h('dd', { id: 'sub-active-metadata', class: 'mono' }))),
        h('dl', { id: 'sub-figs', class: 'figs' })),
      h('h3', { text: 'Line' }),
      h('div', { class: 'scroll' },
        h('table', { id: 'line' }, th('pos', 'member', 'state', 'priority', 'metadata', 'joined', 'in flight', 'gateway'), h('tbody'))),
      h('div', { class: 'cols' },
        h('section', {}, h('h3', { text: 'Leadership' }), h('ol', { id: 'timeline' })),
        h('section', {}, h('h3', { text: 'Rates' }), h('div', { id: 'charts' }))));
  }

  let lastSub = null;
  function renderActions(s, readOnly) {
    lastSub = { s, ro: readOnly };
    const box = $('actions');
    if (readOnly) { box.replaceChildren(); return; }
    if (!$('hand-over')) {
      const btn = (id, text, cls, action) => {
        const b = h('button', { id, type: 'button', class: cls, text });
        b.addEventListener('click', () => ask(action));
        return b;
      };
      box.replaceChildren(btn('hand-over', 'Hand over', 'primary', 'hand-over'), btn('delete', 'Delete', 'danger', 'delete'));
    }
    const ho = $('hand-over');
    ho.disabled = busy || s.mode !== 'singleton' || !s.active;
    ho.title = s.mode !== 'singleton' ? 'only a singleton subscription has a leader to hand over'
      : !s.active ? 'no active member' : 'the active member steps down; the next standby takes over';
    $('delete').disabled = busy;
  }

  function renderSub(d) {
    const root = $('subscription');
    const s = d.subscription;
    if (cur.view !== 'subscription' || !root || !s || s.id !== cur.id) return;
    setMeta(d);
    $('sub-gone').hidden = true;
    root.classList.remove('gone');
    const now = d.now_ms;
    const a = s.active;
    $('sub-mode').textContent = s.mode;
    $('sub-mode').className = 'pill mode-' + s.mode;
    renderActions(s, d.read_only);
    $('sub-active-member').textContent = a ? a.member : DASH;
    $('sub-epoch').textContent = a ? a.epoch : DASH;
    $('sub-active-metadata').textContent = a ? a.metadata : '';
    $('sub-since').textContent = a ? ago(a.since_ms, now) : DASH;
    if (a && a.since_ms != null) $('sub-since').dataset.ago = a.since_ms;
    else delete $('sub-since').dataset.ago;
    $('sub-since').title = a ? clock(a.since_ms) : '';
    const figs = [
      ['group', s.group || DASH], ['patterns', (s.patterns || []).join(' ')], ['members', s.members],
      ['depth', s.depth], ['in flight', s.in_flight], ['published', rate(s.publish_rate) + ' /s'], ['acked', rate(s.ack_rate) + ' /s'],
      ['redelivered', s.redelivered], ['dead-lettered', s.dead_lettered], ['dropped', s.dropped], ['refused', s.refused],
    ];
    $('sub-figs').replaceChildren(...figs.map(([k, v]) => h('div', { class: 'fig' }, h('dt', { text: k }), h('dd', { text: v }))));

    const gw = d.deployment === 'gateway';
    const line = keep($('line').tBodies[0], d.line || [], (m) => m.member + '@' + m.gateway, (m) => h('tr', {
      class: `member state-${String(m.state).replace(/\W+/g, '-')}${m.state === 'active' ? ' is-active' : ''}${m.here && gw ? ' here' : ''}`,
      data: { member: m.member },
    },
    h('td', { class: 'position num', text: m.position }),
    h('td', { class: 'member mono', text: m.member }),
    h('td', { class: 'state' }, h('span', { class: 'pill', text: m.state })),
    h('td', { class: 'priority num', text: m.priority }),
    h('td', { class: 'metadata mono', text: m.metadata }),
    h('td', { class: 'joined', title: clock(m.joined_ms), text: ago(m.joined_ms, now),
      data: m.joined_ms != null ? { ago: m.joined_ms } : null }),
    h('td', { class: 'inflight num', text: m.in_flight == null ? DASH : m.in_flight,
      title: m.in_flight == null ? 'held at another gateway' : null }),
    h('td', { class: 'gateway mono', title: gw ? (m.here ? 'connected to this gateway' : 'connected to another gateway') : null, text: m.gateway == null ? DASH : m.gateway })));
    if (!line.length) line.push(h('tr', { class: 'empty' }, h('td', { colspan: 8, text: 'no members' })));
    $('line').tBodies[0].replaceChildren(...line);

    const tl = keep($('timeline'), d.timeline || [], (t) => t.epoch + '@' + t.member + '@' + t.gateway, (t) => {
      const open = t.end_ms == null;
      return h('li', { class: 'epoch' + (open ? ' current' : ''), data: { epoch: t.epoch } },
        h('div', { class: 'tl-head' },
          h('span', { class: 'tl-epoch mono', text: 'epoch ' + t.epoch }),
          h('span', { class: 'muted', text: 'member' }),
          h('span', { class: 'tl-member mono', text: t.member }),
          t.metadata ? h('span', { class: 'tl-metadata mono', title: t.metadata, text: t.metadata }) : null,
          h('span', { class: 'cause pill', text: t.cause == null ? (open ? 'current' : DASH) : t.cause })),
        h('div', { class: 'tl-time muted' },
          h('span', { class: 'tl-start', title: clock(t.start_ms), text: (open ? 'since ' : '') + hms(t.start_ms) }),
          open
            ? h('span', { class: 'tl-end', data: { for: t.start_ms }, text: `for ${dur(now - t.start_ms)}` })
            : h('span', { class: 'tl-end', title: clock(t.end_ms) },
              `→ ${hms(t.end_ms)} · lasted ${dur(t.end_ms - t.start_ms)} · ended `,
              h('span', { data: { ago: t.end_ms }, text: ago(t.end_ms, now) }))));
    });
    if (!tl.length) tl.push(h('li', { class: 'empty muted', text: s.mode === 'singleton' ? 'no leader yet' : `no leadership in ${s.mode} mode` }));
    $('timeline').replaceChildren(...tl);

    const rt = d.rates || {};
    $('charts').replaceChildren(chart('published/s', rt.published || [], rt.interval_ms, 'pub'), chart('acked/s', rt.acked || [], rt.interval_ms, 'ack'));
  }

  function chart(label, xs, interval, cls) {
    // The x axis spans the samples there are (at least 30 s), up to the last three minutes.
    const W = 300, H = 60, cap = Math.max(30, xs.length);
    const max = Math.max(0, ...xs.filter(isFinite));
    const top = max > 0 ? max * 1.1 : 1;
    const pts = xs.map((v, i) => [(W * (cap - xs.length + i)) / (cap - 1), H - (H * (isFinite(v) ? v : 0)) / top]);
    const p = pts.map(([x, y]) => x.toFixed(1) + ',' + y.toFixed(1)).join(' ');
    const el = svg('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', class: 'spark ' + cls, role: 'img', 'aria-label': label },
      svg('title', {}, label), svg('line', { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: 'axis' }));
    if (pts.length > 1) {
      el.append(svg('polygon', { points: `${pts[0][0]},${H} ${p} ${W},${H}`, class: 'area' }),
        svg('polyline', { points: p, class: 'line', 'vector-effect': 'non-scaling-stroke' }));
    }
    const span = interval ? dur(cap * interval) : '';
    return h('figure', { class: 'chart' },
      h('figcaption', {},
        h('span', { class: 'chart-label', text: label }),
        h('strong', { class: 'mono', text: xs.length ? rate(xs[xs.length - 1]) : DASH }),
        h('span', { class: 'muted', text: `max ${rate(max)}${span ? ' · last ' + span : ''}` })),
      el);
  }

  function renderGone(d) {
    if (cur.view !== 'subscription' || !$('subscription')) return;
    const b = $('sub-gone');
    b.textContent = 'This subscription no longer exists' + (d && d.error ? ': ' + d.error : '.');
    b.hidden = false;
    $('subscription').classList.add('gone');
    $('actions').replaceChildren();
  }

  // ---- actions -------------------------------------------------------------
  let pending = null;
  let busy = false;

  function setResult(cls, text) {
    const r = $('action-result');
    r.className = cls;
    r.textContent = text;
    r.hidden = !text;
  }

  function ask(action) {
    if (cur.view !== 'subscription') return;
    const id = cur.id;
    pending = { action, id };
    const del = action === 'delete';
    $('confirm-title').textContent = del ? 'Delete subscription?' : 'Hand over leadership?';
    $('confirm-text').textContent = del
      ? `Delete subscription “${id}”? Its queued messages are discarded and its members are detached.`
      : `Hand-over of subscription “${id}”: the active member steps down and the next standby becomes active.`;
    const yes = $('confirm-yes');
    yes.textContent = del ? 'Delete' : 'Hand over';
    yes.className = del ? 'danger' : 'primary';
    $('confirm').showModal();
    $('confirm-no').focus();
  }

  async function act({ action, id }) {
    busy = true;
    for (const b of $('actions').querySelectorAll('button')) b.disabled = true;
    setResult('pending', `${action} of “${id}”…`);
    try {
      const r = await fetch(`/api/subscriptions/${encodeURIComponent(id)}/${action}`, {
        method: 'POST', credentials: 'same-origin', headers: { 'X-Tinybroker-Console': '1' },
      });
      let body = {};
      try { body = await r.json(); } catch (_) { /* no JSON body */ }
      if (!r.ok) {
        throw new Error((body.error || `HTTP ${r.status} ${r.statusText}`) + (body.code ? ` (${body.code})` : ''));
      }
      if (action === 'delete') {
        const n = body.deleted_messages;
        setResult('ok', `Deleted subscription “${id}”` + (n == null ? '.' : ` (${n} message${n === 1 ? '' : 's'} discarded).`));
        if (cur.view === 'subscription' && cur.id === id) { keepResult = true; location.hash = lastOverview; }
      } else {
        setResult('ok', `Handed over “${id}”: member ${body.member} is active at epoch ${body.epoch}.`);
      }
    } catch (e) {
      setResult('error', `${action} of “${id}” failed: ${e.message}`);
    } finally {
      busy = false;
      if (lastSub && $('actions') && !$('subscription').classList.contains('gone')) renderActions(lastSub.s, lastSub.ro);
    }
  }

  // ---- wiring --------------------------------------------------------------
  function init() {
    let t = 0;
    $('search').addEventListener('input', (e) => {
      clearTimeout(t);
      const q = e.target.value;
      t = setTimeout(() => {
        const want = overviewHash(q.trim(), 1);
        if (location.hash !== want) { history.replaceState(null, '', want); route(); }
      }, 200);
    });
    $('prev').addEventListener('click', () => { location.hash = overviewHash(cur.q || '', Math.max(1, (cur.page || 1) - 1)); });
    $('next').addEventListener('click', () => { location.hash = overviewHash(cur.q || '', (cur.page || 1) + 1); });
    $('confirm-no').addEventListener('click', () => { pending = null; $('confirm').close(); });
    $('confirm').addEventListener('cancel', () => { pending = null; });
    $('confirm-yes').addEventListener('click', () => {
      const p = pending;
      pending = null;
      $('confirm').close();
      if (p) act(p);
    });
    document.addEventListener('keydown', (e) => {
      const tag = (e.target.tagName || '').toLowerCase();
      if (e.key === '/' && cur.view === 'overview' && tag !== 'input' && tag !== 'textarea') {
        e.preventDefault();
        $('search').focus();
      }
    });
    window.addEventListener('hashchange', route);
    route();
  }
  init();
})();
