// Relay Console: fills the page the gateway rendered (api/routes/console.py) from Relay's public REST API, with the
// API key the user entered once. The key lives in this tab's sessionStorage and goes only into the Authorization
// header of requests to this origin: never into a URL, a cookie or the page.
//
// Everything an application wrote (workflow names, inputs, outputs, errors, executor metadata) is put into the page
// as text (textContent, text nodes), never as markup: no innerHTML anywhere in this file.
'use strict';

(() => {
  const KEY = 'relay.key';
  const ORG = 'relay.org';
  const POLL_MS = 1000;
  const PAGE_SIZE = 100;
  const FOLD_CHARS = 2000;

  const main = document.getElementById('main');
  const ds = main.dataset;
  const session = window.sessionStorage;
  const $ = (id) => document.getElementById(id);

  // -- DOM, as text only ----------------------------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === 'class') node.className = value;
      else if (name === 'text') node.textContent = String(value);
      else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? '' : String(value));
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function fill(parent, ...children) {
    parent.replaceChildren(...children.filter((c) => c !== undefined && c !== null));
  }

  function link(href, text) {
    return el('a', { href }, text);
  }

  // -- units --------------------------------------------------------------------------------------------------

  function duration(ms) {
    if (ms === null || ms === undefined) return 'off';
    const s = ms / 1000;
    if (s < 120) return `${+s.toFixed(3)} s`;
    if (s < 7200) return `${+(s / 60).toFixed(1)} min`;
    if (s < 172800) return `${+(s / 3600).toFixed(1)} h`;
    return `${+(s / 86400).toFixed(1)} days`;
  }

  function when(iso) {
    if (!iso) return '';
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
  }

  // -- the API ------------------------------------------------------------------------------------------------

  class Problem extends Error {
    constructor(status, detail) {
      super(status === 403 ? `not allowed: ${detail}` : detail);
      this.status = status;
    }
  }

  // Bumped when the key changes: an answer to a request sent with the previous key is dropped, never shown.
  let generation = 0;

  async function api(path, { method = 'GET', body } = {}) {
    const sent = generation;
    const headers = { Authorization: `Bearer ${session.getItem(KEY)}`, Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const org = encodeURIComponent(session.getItem(ORG) || 'local');
    const response = await fetch(`${ds.root}/v2/orgs/${org}/${path}`, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store',
      credentials: 'omit', referrerPolicy: 'no-referrer',
    });
    if (sent !== generation) return new Promise(() => undefined);
    if (response.status === 401) {
      signOut('Relay refused this key (401). Enter another.');
      throw new Problem(401, 'the key was refused');
    }
    const text = await response.text();
    // Checked again after the body is read: the key may have changed while it came in.
    if (sent !== generation) return new Promise(() => undefined);
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const detail = (data && (data.detail || data.title)) || response.statusText || `HTTP ${response.status}`;
      throw new Problem(response.status, String(detail));
    }
    return data;
  }

  const app = () => encodeURIComponent(ds.app);
  const appPath = (rest) => `apps/${app()}/${rest}`;

  function say(target, err) {
    target.textContent = err instanceof Error ? err.message : String(err);
  }

  function notice(message) {
    const box = $('notice');
    box.hidden = !message;
    box.textContent = message || '';
  }

  // -- the key ------------------------------------------------------------------------------------------------

  function signOut(message) {
    generation += 1;
    session.removeItem(KEY);
    // Nothing read with the previous key stays on the page for the next one to see.
    for (const shown of main.querySelectorAll('tbody, dl, ol, #io, #secret-value')) shown.replaceChildren();
    main.hidden = true;
    $('session').hidden = true;
    $('signin').hidden = false;
    $('signin-error').textContent = message || '';
    stopPolls();
  }

  function signedIn() {
    $('signin').hidden = true;
    $('session').hidden = false;
    $('session-org').textContent = `org ${session.getItem(ORG) || 'local'}`;
    main.hidden = false;
    (PAGES[ds.page] || (() => undefined))();
  }

  $('signin-form').addEventListener('submit', (event) => {
    event.preventDefault();
    session.setItem(ORG, $('signin-org').value.trim() || 'local');
    session.setItem(KEY, $('signin-key').value);
    $('signin-key').value = '';
    signedIn();
  });
  $('forget').addEventListener('click', () => signOut(''));

  // -- polling, paused while the tab is hidden ----------------------------------------------------------------

  const polls = [];
  function poll(fn) {
    let busy = false;
    const run = async () => {
      if (busy || document.hidden) return;
      busy = true;
      try {
        await fn();
      } finally {
        busy = false;
      }
    };
    run();
    polls.push(setInterval(run, POLL_MS));
  }
  function stopPolls() {
    while (polls.length) clearInterval(polls.pop());
  }

  // -- pages --------------------------------------------------------------------------------------------------

  function counts(items, key) {
    const out = new Map();
    for (const item of items) out.set(item[key], (out.get(item[key]) || 0) + 1);
    return [...out.entries()].sort().map(([k, n]) => `${n} ${k}`).join(', ');
  }

  async function appsPage() {
    const body = $('apps').tBodies[0];
    try {
      const apps = await api('apps');
      fill(body, ...apps.map((a) => el('tr', { 'data-app': a.name },
        el('td', {}, link(`${ds.console}/apps/${encodeURIComponent(a.name)}`, a.name)),
        el('td', { class: 'executors' }, '…'), el('td', { class: 'versions' }, ''),
        el('td', {}, `${a.executorTimeoutSecs} s`),
        el('td', {}, `${duration(a.gcTimeThresholdMs)} (${a.gcTimeThresholdMs ?? 'null'} ms)`),
        el('td', {}, `${duration(a.globalTimeoutMs)} (${a.globalTimeoutMs ?? 'null'} ms)`))));
      if (!apps.length) fill(body, el('tr', {}, el('td', { colspan: 6 }, 'No application yet.')));
      await Promise.all(apps.map(async (a) => {
        const row = body.querySelector(`tr[data-app="${CSS.escape(a.name)}"]`);
        try {
          const executors = await api(`apps/${encodeURIComponent(a.name)}/executors`);
          row.querySelector('.executors').textContent = counts(executors, 'status') || 'none';
          row.querySelector('.versions').textContent = counts(executors, 'appVersion');
        } catch (err) {
          say(row.querySelector('.executors'), err);
        }
      }));
    } catch (err) {
      if (err.status !== 401) fill(body, el('tr', {}, el('td', { colspan: 6, class: 'error' }, err.message)));
    }
  }

  async function settings() {
    const a = await api(`apps/${app()}`);
    const rows = [
      ['Grace before DEAD', `${a.executorTimeoutSecs} s`, `executorTimeoutSecs ${a.executorTimeoutSecs}`],
      ['Retention', duration(a.gcTimeThresholdMs), `gcTimeThresholdMs ${a.gcTimeThresholdMs ?? 'null'}`],
      ['Rows kept', a.gcRowsThreshold ?? 'no limit', `gcRowsThreshold ${a.gcRowsThreshold ?? 'null'}`],
      ['Global timeout', duration(a.globalTimeoutMs), `globalTimeoutMs ${a.globalTimeoutMs ?? 'null'}`],
      ['Cross-version recovery', a.crossVersionRecovery ? 'on' : 'off', ''],
      ['Language', a.language || 'unknown', ''],
    ];
    fill($('settings'), ...rows.flatMap(([name, value, raw]) => [
      el('dt', {}, name), el('dd', {}, value, raw ? el('span', { class: 'raw' }, ` (${raw})`) : null)]));
    if (!$('settings-form').contains(document.activeElement)) {
      $('grace').value = a.executorTimeoutSecs;
      shownIn(a.gcTimeThresholdMs, 'retention');
      shownIn(a.globalTimeoutMs, 'timeout');
      $('rows').value = a.gcRowsThreshold ?? '';
      $('rows').dataset.shown = $('rows').value;
      $('cross-version').checked = Boolean(a.crossVersionRecovery);
      $('cross-version').dataset.shown = String($('cross-version').checked);
    }
  }

  function shownIn(ms, field) {  // a duration in the form: in days when whole days, else in hours
    const unit = ms && ms % 86400000 === 0 ? 86400000 : 3600000;
    $(`${field}-unit`).value = String(unit);
    $(field).value = ms === null || ms === undefined ? '' : String(+(ms / unit).toFixed(6));
    $(field).dataset.shown = `${$(field).value} ${unit}`;
  }

  function fromForm(field) {
    // The form's duration in milliseconds, null when left empty; undefined (not sent) when left as shown, so a
    // value the form rounded for display is never written back.
    const value = $(field).value.trim();
    const unit = $(`${field}-unit`).value;
    if (`${value} ${unit}` === $(field).dataset.shown) return undefined;
    return value === '' ? null : Math.round(Number(value) * Number(unit));
  }

  async function executors(drained) {
    const list = await api(appPath('executors'));
    const body = $('executors').tBodies[0];
    fill(body, ...list.map((e) => {
      const drain = drained.get(e.executorId);
      const toggle = el('button', {
        type: 'button',
        onclick: () => toggleDrain(e.executorId, Boolean(drain)),
      }, drain ? 'Undrain' : 'Drain');
      return el('tr', { 'data-executor': e.executorId, 'data-status': e.status },
        el('td', {}, el('code', {}, e.executorId)),
        el('td', { class: `status ${e.status}` }, e.status),
        el('td', {}, e.appVersion), el('td', {}, e.hostname), el('td', {}, e.language),
        el('td', {}, e.dbosVersion), el('td', { class: 'gateway' }, e.gateway || ''), el('td', {}, when(e.createdAt)),
        el('td', {}, el('code', { class: 'metadata' }, e.executorMetadata ? JSON.stringify(e.executorMetadata) : '')),
        el('td', {}, drain ? `drained until ${when(drain.until)} ` : '', toggle));
    }));
    if (!list.length) fill(body, el('tr', {}, el('td', { colspan: 10 }, 'No executor connected.')));
  }

  async function toggleDrain(executorId, drained) {
    try {
      if (drained) await api(appPath(`executors/${encodeURIComponent(executorId)}/drain`), { method: 'DELETE' });
      else {
        await api(appPath(`executors/${encodeURIComponent(executorId)}/drain`),
          { method: 'PUT', body: { expiresInSecs: 3600, reason: 'drained from the console' } });
      }
      notice('');
    } catch (err) {
      notice(err.message);
    }
  }

  function lifecycleLink(executorId) {
    if (!ds.temporalUi) return null;
    const id = `relay-executor/${session.getItem(ORG) || 'local'}/${ds.app}/${executorId}`;
    return el('a', { href: ds.temporalUi + encodeURIComponent(id), rel: 'noreferrer', target: '_blank' },
      'lifecycle workflow');
  }

  async function lifecycle() {
    const target = $('events');
    try {
      const rows = await api(`audit-logs?target=${app()}&limit=50`);
      const shown = rows.filter((r) => r.operation.startsWith('executor.'));
      fill(target, ...shown.map((r) => {
        const executorId = r.details && r.details.executorId;
        const recovery = r.operation.startsWith('executor.recovery.');
        return el('li', { 'data-operation': r.operation, class: r.status === 'failure' ? 'failed' : null },
          el('time', {}, when(r.emitTime)), ' ', el('strong', {}, r.operation), ' ',
          executorId ? el('code', {}, executorId) : null, ' ',
          recovery && executorId ? lifecycleLink(executorId) : null);
      }));
      if (!shown.length) fill(target, el('li', {}, 'Nothing yet.'));
    } catch (err) {
      fill(target, el('li', { class: 'error' }, err.message));
    }
  }

  // -- pictures, from the audit log: drawn as SVG elements, their labels text nodes ------------------------------

  const SVG = 'http://www.w3.org/2000/svg';
  const STATUS_AFTER = {
    'executor.healthy': 'HEALTHY', 'executor.reconnected': 'HEALTHY', 'executor.disconnected': 'DISCONNECTED',
    'executor.dead': 'DEAD', 'executor.deleted': null, 'executor.superseded': null,
  };
  const STATUSES = ['HEALTHY', 'DISCONNECTED', 'DEAD'];

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    for (const child of children) node.append(child instanceof Node ? child : String(child));
    return node;
  }

  function bars(buckets, { label, stack, text }) {  // buckets: [{label, values: {series: n}, note}]
    const width = 36 * buckets.length + 40;
    const height = 160;
    const top = Math.max(1, ...buckets.map((b) => stack.reduce((n, k) => n + (b.values[k] || 0), 0)));
    const chart = svg('svg', { viewBox: `0 0 ${width} ${height + 40}`, role: 'img', 'aria-label': label,
      class: 'bars' });
    chart.append(svg('text', { x: 0, y: 12, class: 'axis' }, String(top)));
    buckets.forEach((b, i) => {
      let y = height;
      for (const series of stack) {
        const n = b.values[series] || 0;
        const h = (n / top) * (height - 20);
        if (n) {
          y -= h;
          chart.append(svg('rect', { x: 40 + i * 36, y, width: 28, height: h, class: `bar ${series}` },
            svg('title', {}, `${b.label}: ${n} ${series}`)));
        }
      }
      chart.append(svg('text', { x: 40 + i * 36, y: height + 14, class: 'axis' }, b.label));
      if (text && b.note) chart.append(svg('text', { x: 40 + i * 36, y: height + 30, class: 'note' }, b.note));
    });
    return chart;
  }

  function statusHistory(events, current, now) {
    // Each executor's status at the end of each 5-minute step: the last event before it, else (before its first
    // event) what that event implies came before (nothing for a new executor, HEALTHY otherwise), else its status
    // now.
    const byExecutor = new Map();
    for (const e of events) {
      const id = e.details && e.details.executorId;
      if (!id || !(e.operation in STATUS_AFTER)) continue;
      if (!byExecutor.has(id)) byExecutor.set(id, []);
      byExecutor.get(id).push([Date.parse(e.emitTime), STATUS_AFTER[e.operation], e.operation]);
    }
    for (const list of byExecutor.values()) list.sort((a, b) => a[0] - b[0]);
    const buckets = [];
    for (let i = 11; i >= 0; i -= 1) {
      const t = now - i * 5 * 60 * 1000;
      const values = {};
      const count = (status) => { if (status) values[status] = (values[status] || 0) + 1; };
      for (const [id, list] of byExecutor) {
        const before = list.filter(([at]) => at <= t);
        if (before.length) count(before[before.length - 1][1]);
        else if (list[0][2] !== 'executor.healthy') count('HEALTHY');
        current.delete(id);
      }
      for (const status of current.values()) count(status);
      buckets.push({ label: new Date(t).toTimeString().slice(0, 5), values });
    }
    return buckets;
  }

  function recoveryHistory(events, now) {
    const dead = new Map();
    const hours = new Map();
    for (const e of [...events].sort((a, b) => Date.parse(a.emitTime) - Date.parse(b.emitTime))) {
      const id = e.details && e.details.executorId;
      if (!id) continue;
      if (e.operation === 'executor.dead') dead.set(id, Date.parse(e.emitTime));
      if (e.operation === 'executor.recovery.succeeded') {
        const at = Date.parse(e.emitTime);
        const hour = Math.floor((now - at) / 3600000);
        if (hour < 24) {
          if (!hours.has(hour)) hours.set(hour, []);
          hours.get(hour).push(dead.has(id) ? at - dead.get(id) : null);
        }
      }
    }
    const buckets = [];
    for (let hour = 23; hour >= 0; hour -= 1) {
      const latencies = (hours.get(hour) || []).filter((l) => l !== null).sort((a, b) => a - b);
      const median = latencies.length ? latencies[Math.floor(latencies.length / 2)] : null;
      buckets.push({
        label: hour === 0 ? 'now' : `-${hour}h`,
        values: { recovered: (hours.get(hour) || []).length },
        note: median === null ? '' : `${(median / 1000).toFixed(1)}s`,
      });
    }
    return buckets;
  }

  async function charts() {
    const now = Date.now();
    const since = new Date(now - 24 * 3600 * 1000).toISOString();
    try {
      const [events, executorsNow] = await Promise.all([
        api(`audit-logs?target=${app()}&startTime=${encodeURIComponent(since)}&limit=1000`),
        api(appPath('executors')),
      ]);
      const current = new Map(executorsNow.map((e) => [e.executorId, e.status]));
      const hour = events.filter((e) => Date.parse(e.emitTime) >= now - 3600000);
      fill($('status-chart'), bars(statusHistory(hour, current, now),
        { label: 'executors by status', stack: STATUSES }));
      const recoveries = recoveryHistory(events, now);
      fill($('recovery-chart'), bars(recoveries, { label: 'recoveries per hour', stack: ['recovered'], text: true }));
      $('recovery-chart').dataset.recovered = String(recoveries.reduce((n, b) => n + b.values.recovered, 0));
    } catch (err) {
      fill($('status-chart'), el('p', { class: 'error' }, err.message));
      fill($('recovery-chart'));
    }
  }

  async function appPage() {
    $('settings-form').addEventListener('submit', async (event) => {
      event.preventDefault();
      $('settings-error').textContent = '';
      try {
        await api(`apps/${app()}`, { method: 'PATCH', body: {
          executorTimeoutSecs: Number($('grace').value),
          gcTimeThresholdMs: fromForm('retention'),
          globalTimeoutMs: fromForm('timeout'),
          gcRowsThreshold: $('rows').value === $('rows').dataset.shown ? undefined
            : ($('rows').value === '' ? null : Number($('rows').value)),
          crossVersionRecovery: String($('cross-version').checked) === $('cross-version').dataset.shown ? undefined
            : $('cross-version').checked,
        } });
        document.activeElement.blur();
        await settings();
      } catch (err) {
        say($('settings-error'), err);
      }
    });
    try {
      await settings();
    } catch (err) {
      fill($('settings'), el('dd', { class: 'error' }, err.message));
    }
    poll(async () => {
      try {
        let drained = new Map();
        try {
          drained = new Map((await api(appPath('drains'))).filter((d) => d.active).map((d) => [d.executorId, d]));
        } catch {
          drained = new Map();
        }
        await executors(drained);
      } catch (err) {
        fill($('executors').tBodies[0], el('tr', {}, el('td', { colspan: 10, class: 'error' }, err.message)));
      }
    });
    poll(lifecycle);
    charts();
    polls.push(setInterval(() => { if (!document.hidden) charts(); }, 15 * POLL_MS));
  }

  // -- workflows ----------------------------------------------------------------------------------------------

  const LIST_FIELDS = ['status', 'workflowName', 'appVersion', 'queueName', 'workflowIdPrefix'];

  function searchBody(params, offset) {
    const body = { limit: PAGE_SIZE + 1, offset, sortDesc: true, loadInput: false, loadOutput: false };
    for (const field of LIST_FIELDS) {
      const value = params.get(field);
      if (value) body[field] = [value];
    }
    for (const field of ['startTime', 'endTime']) {
      const value = params.get(field);
      if (value) body[field] = new Date(value).toISOString();
    }
    return body;
  }

  // A search whose filters and page live in the URL, so it can be shared: the form is filled from it, Search starts
  // again from the first page, Previous and Next move by PAGE_SIZE. ``draw(params, offset)`` reads PAGE_SIZE + 1
  // rows from offset (one more than shown: there is a next page), draws at most PAGE_SIZE, and returns how many it
  // read, or null when it drew an error instead.
  function pagedSearch(form, draw) {
    const params = new URLSearchParams(window.location.search);
    for (const [name, value] of params) if (form.elements[name]) form.elements[name].value = value;
    const search = { offset: Number(params.get('offset')) || 0 };

    search.load = async () => {
      const read = await draw(params, search.offset);
      if (read === null) return;
      const shown = Math.min(read, PAGE_SIZE);
      $('previous').disabled = search.offset === 0;
      $('next').disabled = read <= PAGE_SIZE;
      $('page-label').textContent = shown ? `${search.offset + 1}–${search.offset + shown}` : '';
    };
    search.go = (offset) => {
      search.offset = Math.max(0, offset);
      if (search.offset) params.set('offset', String(search.offset));
      else params.delete('offset');
      window.history.replaceState(null, '', `?${params}`);
      return search.load();
    };
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      for (const element of form.elements) {
        if (!element.name) continue;
        if (element.value) params.set(element.name, element.value);
        else params.delete(element.name);
      }
      search.go(0);
    });
    $('previous').addEventListener('click', () => search.go(search.offset - PAGE_SIZE));
    $('next').addEventListener('click', () => search.go(search.offset + PAGE_SIZE));
    return search;
  }

  async function workflowsPage() {
    const selected = new Set();
    const bulkButtons = () => {
      $('bulk-cancel').disabled = $('bulk-resume').disabled = selected.size === 0;
    };

    const search = pagedSearch($('search'), async (params, offset) => {
      const body = $('workflows').tBodies[0];
      selected.clear();
      bulkButtons();
      $('select-all').checked = false;
      try {
        const listed = await api(appPath('workflows/search'), { method: 'POST', body: searchBody(params, offset) });
        const page = listed.slice(0, PAGE_SIZE);
        const rendering = performance.now();  // measured as 'workflows-render' (performance.measure)
        fill(body, ...page.map((w) => el('tr', { 'data-workflow': w.workflowId },
          el('td', {}, el('input', {
            type: 'checkbox', 'aria-label': `Select ${w.workflowId}`,
            onchange: (event) => {
              if (event.target.checked) selected.add(w.workflowId);
              else selected.delete(w.workflowId);
              bulkButtons();
            },
          })),
          el('td', {}, link(`${ds.console}/apps/${app()}/workflows/${encodeURIComponent(w.workflowId)}`, w.workflowId)),
          el('td', {}, w.workflowName), el('td', { class: `status ${w.status}` }, w.status),
          el('td', {}, w.appVersion), el('td', {}, w.queueName || ''), el('td', {}, when(w.createdAt)),
          el('td', {}, el('code', {}, w.executorId || '')))));
        if (!page.length) fill(body, el('tr', {}, el('td', { colspan: 8 }, 'No workflow matches.')));
        performance.measure('workflows-render', { start: rendering });
        return listed.length;
      } catch (err) {
        fill(body, el('tr', {}, el('td', { colspan: 8, class: 'error' }, err.message)));
        return null;
      }
    });

    $('select-all').addEventListener('change', (event) => {
      for (const box of $('workflows').tBodies[0].querySelectorAll('input[type=checkbox]')) {
        if (box.checked !== event.target.checked) box.click();
      }
    });
    for (const [id, path, verb] of [['bulk-cancel', 'bulk-cancel', 'Cancel'],
      ['bulk-resume', 'bulk-resume', 'Resume']]) {
      $(id).addEventListener('click', async () => {
        const ids = [...selected];
        if (!window.confirm(`${verb} ${ids.length} workflow(s): ${ids.join(', ')}?`)) return;
        try {
          await api(appPath(`workflows/${path}`), { method: 'POST', body: { workflowIds: ids } });
          $('bulk-error').textContent = '';
          await search.load();
        } catch (err) {
          say($('bulk-error'), err);
        }
      });
    }
    await search.load();
  }

  function pretty(value) {
    if (value === null || value === undefined) return 'none';
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return String(value);
    }
  }

  function block(title, value) {
    const text = pretty(value);
    const pre = el('pre', {}, text);
    if (text.length <= FOLD_CHARS) return el('div', { class: 'io' }, el('h3', {}, title), pre);
    return el('details', { class: 'io' }, el('summary', {}, `${title} (${text.length} characters)`), pre);
  }

  function timeline(steps) {
    const spans = steps.map((s) => {
      const start = s.startedAt ? Date.parse(s.startedAt) : NaN;
      const end = s.completedAt ? Date.parse(s.completedAt) : NaN;
      return Number.isNaN(start) || Number.isNaN(end) ? null : Math.max(0, end - start);
    });
    const longest = Math.max(1, ...spans.filter((s) => s !== null));
    return steps.map((s, i) => {
      const ms = spans[i];
      const bar = el('span', { class: 'bar', role: 'presentation' });
      bar.style.width = `${ms === null ? 0 : Math.max(0.5, (100 * ms) / longest)}%`;
      return el('li', { class: s.error ? 'step failed' : 'step', 'data-step': s.stepId },
        el('span', { class: 'step-id' }, `#${s.stepId}`), ' ', el('span', { class: 'step-name' }, s.stepName), ' ',
        el('span', { class: 'track' }, bar), ' ',
        el('span', { class: 'step-ms' }, ms === null ? 'running' : `${ms} ms`),
        s.error ? el('pre', { class: 'error' }, s.error) : null,
        s.output !== null && s.output !== undefined ? el('code', { class: 'step-output' }, s.output) : null);
    });
  }

  async function workflowPage() {
    const id = ds.workflow;
    const path = appPath(`workflows/${encodeURIComponent(id)}`);
    const done = $('action-done');
    const error = $('action-error');

    let status = null;
    let timer = null;
    async function follow() {  // a running workflow's page follows it until it ends
      clearTimeout(timer);
      await load();
      if (status === 'PENDING' || status === 'ENQUEUED') timer = setTimeout(follow, POLL_MS);
    }

    async function load() {
      try {
        const w = await api(path);
        status = w.status;
        fill($('summary'), ...[
          ['Status', w.status], ['Name', w.workflowName], ['Version', w.appVersion], ['Executor', w.executorId],
          ['Queue', w.queueName], ['Created', when(w.createdAt)], ['Updated', when(w.updatedAt)],
          ['Forked from', w.forkedFrom],
        ].filter(([, v]) => v).flatMap(([k, v]) => [el('dt', {}, k), el('dd', { 'data-field': k }, v)]));
        fill($('io'), block('Input', w.input), block('Output', w.output), w.error ? block('Error', w.error) : null);
      } catch (err) {
        fill($('summary'), el('dd', { class: 'error' }, err.message));
      }
      try {
        const steps = await api(`${path}/steps`);
        fill($('steps'), ...timeline(steps));
        if (!steps.length) fill($('steps'), el('li', {}, 'No step yet.'));
        const select = $('fork-step');
        const chosen = select.value;
        fill(select, el('option', { value: '0' }, 'the start'), ...steps.map((s) => el('option',
          { value: String(s.stepId) }, `#${s.stepId} ${s.stepName}`)));
        if (chosen) select.value = chosen;
      } catch (err) {
        fill($('steps'), el('li', { class: 'error' }, err.message));
      }
      try {
        const notes = await api(`${path}/notifications`);
        fill($('wf-notifications'), ...notes.map((n) => el('li', {}, el('strong', {}, n.topic ?? '(no topic)'), ' ',
          el('time', {}, when(n.createdAt)), ' ', el('code', {}, pretty(n.message)))));
        if (!notes.length) fill($('wf-notifications'), el('li', {}, 'None.'));
      } catch (err) {
        fill($('wf-notifications'), el('li', { class: 'muted' }, err.message));
      }
      try {
        const events = await api(`${path}/events`);
        fill($('wf-events'), ...events.flatMap((e) => [el('dt', {}, e.key), el('dd', {}, pretty(e.value))]));
      } catch (err) {
        fill($('wf-events'), el('dd', { class: 'muted' }, err.message));
      }
    }

    async function act(verb, request, after) {
      if (!window.confirm(`${verb} workflow ${id}?`)) return;
      error.textContent = '';
      done.textContent = '';
      try {
        const reply = await request();
        after(reply);
        await follow();
      } catch (err) {
        say(error, err);
      }
    }

    $('cancel').addEventListener('click', () => act('Cancel', () => api(`${path}/cancel`, { method: 'POST', body: {} }),
      () => { done.textContent = 'Cancelled.'; }));
    $('resume').addEventListener('click', () => act('Resume', () => api(`${path}/resume`, { method: 'POST', body: {} }),
      () => { done.textContent = 'Resumed.'; }));
    $('fork').addEventListener('click', () => {
      const step = Number($('fork-step').value) || 0;
      act(`Fork from step ${step}`, () => api(`${path}/fork`, { method: 'POST', body: { startStep: step } }),
        (reply) => {
          fill(done, 'Forked: ', link(`${ds.console}/apps/${app()}/workflows/${encodeURIComponent(reply.workflowId)}`,
            reply.workflowId));
        });
    });
    await follow();
  }

  // -- queues and schedules ------------------------------------------------------------------------------------

  async function queuesPage() {
    const error = $('schedules-error');
    const done = $('schedules-done');
    try {
      const queues = await api(appPath('queues'));
      fill($('queues').tBodies[0], ...queues.map((q) => el('tr', { 'data-queue': q.name },
        el('td', {}, q.name), el('td', {}, q.concurrency ?? 'no limit'), el('td', {}, q.workerConcurrency ?? 'no limit'),
        el('td', {}, q.rateLimitMax ? `${q.rateLimitMax} per ${q.rateLimitPeriodSecs} s` : 'none'),
        el('td', {}, q.priorityEnabled ? 'yes' : 'no'), el('td', {}, q.partitionQueue ? 'yes' : 'no'))));
      if (!queues.length) fill($('queues').tBodies[0], el('tr', {}, el('td', { colspan: 6 }, 'No queue.')));
    } catch (err) {
      fill($('queues').tBodies[0], el('tr', {}, el('td', { colspan: 6, class: 'error' }, err.message)));
    }

    async function act(name, verb, path) {
      if (!window.confirm(`${verb} schedule ${name}?`)) return;
      error.textContent = '';
      try {
        const reply = await api(appPath(`schedules/${encodeURIComponent(name)}/${path}`), { method: 'POST' });
        done.textContent = `${verb}: ${name}${reply && reply.workflowId ? ` (workflow ${reply.workflowId})` : ''}`;
        await load();
      } catch (err) {
        say(error, err);
      }
    }

    async function load() {
      try {
        const schedules = await api(appPath('schedules'));
        fill($('schedules').tBodies[0], ...schedules.map((x) => el('tr', { 'data-schedule': x.scheduleName },
          el('td', {}, x.scheduleName), el('td', {}, x.workflowName), el('td', {}, el('code', {}, x.cronExpression)),
          el('td', { class: `status ${x.status}` }, x.status), el('td', {}, when(x.lastFiredAt)),
          el('td', {},
            x.status === 'PAUSED'
              ? el('button', { type: 'button', onclick: () => act(x.scheduleName, 'Resume', 'resume') }, 'Resume')
              : el('button', { type: 'button', onclick: () => act(x.scheduleName, 'Pause', 'pause') }, 'Pause'),
            ' ', el('button', { type: 'button', onclick: () => act(x.scheduleName, 'Trigger', 'trigger') }, 'Trigger'))
        )));
        if (!schedules.length) fill($('schedules').tBodies[0], el('tr', {}, el('td', { colspan: 6 }, 'No schedule.')));
        const select = $('backfill-schedule');
        const chosen = select.value;
        fill(select, ...schedules.map((x) => el('option', {}, x.scheduleName)));
        if (chosen) select.value = chosen;
      } catch (err) {
        fill($('schedules').tBodies[0], el('tr', {}, el('td', { colspan: 6, class: 'error' }, err.message)));
      }
    }

    $('backfill').addEventListener('submit', async (event) => {
      event.preventDefault();
      const name = $('backfill-schedule').value;
      const start = new Date($('backfill-start').value);
      const end = new Date($('backfill-end').value);
      if (!window.confirm(`Backfill schedule ${name} from ${start.toLocaleString()} to ${end.toLocaleString()}?`)) {
        return;
      }
      error.textContent = '';
      try {
        const reply = await api(appPath(`schedules/${encodeURIComponent(name)}/backfill`),
          { method: 'POST', body: { startTime: start.toISOString(), endTime: end.toISOString() } });
        done.textContent = `Backfilled ${name}: ${reply.workflowIds.length} workflow(s)`;
      } catch (err) {
        say(error, err);
      }
    });
    await load();
  }

  // -- alert rules --------------------------------------------------------------------------------------------

  async function alertsPage() {
    const error = $('rules-error');
    async function load() {
      try {
        const rules = await api(appPath('alerting-rules'));
        fill($('rules').tBodies[0], ...rules.map((r) => el('tr', { 'data-rule': r.id },
          el('td', {}, el('code', {}, r.id)), el('td', {}, r.ruleType),
          el('td', {}, el('code', {}, JSON.stringify(r.ruleMetadata))),
          el('td', {}, r.minIntervalSecs === null || r.minIntervalSecs === undefined ? 'none' : `${r.minIntervalSecs} s`),
          el('td', {}, r.receivingAppName), el('td', {}, when(r.lastFiredAt)),
          el('td', {}, el('button', {
            type: 'button',
            onclick: async () => {
              if (!window.confirm(`Delete alert rule ${r.id} (${r.ruleType})?`)) return;
              try {
                await api(appPath(`alerting-rules/${encodeURIComponent(r.id)}`), { method: 'DELETE' });
                await load();
              } catch (err) {
                say(error, err);
              }
            },
          }, 'Delete')))));
        if (!rules.length) fill($('rules').tBodies[0], el('tr', {}, el('td', { colspan: 7 }, 'No alert rule.')));
      } catch (err) {
        fill($('rules').tBodies[0], el('tr', {}, el('td', { colspan: 7, class: 'error' }, err.message)));
      }
    }
    $('new-rule').addEventListener('submit', async (event) => {
      event.preventDefault();
      error.textContent = '';
      let metadata;
      try {
        metadata = JSON.parse($('rule-metadata').value || '{}');
      } catch {
        error.textContent = 'Settings must be a JSON object, e.g. {"minFailures": 3}';
        return;
      }
      const interval = $('rule-interval').value;
      try {
        await api(appPath('alerting-rules'), {
          method: 'POST',
          body: { ruleType: $('rule-type').value, ruleMetadata: metadata,
            minIntervalSecs: interval === '' ? null : Number(interval) },
        });
        await load();
      } catch (err) {
        say(error, err);
      }
    });
    await load();
  }

  // -- keys -----------------------------------------------------------------------------------------------------

  async function keysPage() {
    const error = $('tokens-error');
    async function load() {
      try {
        const tokens = await api('tokens');
        fill($('tokens').tBodies[0], ...tokens.map((t) => el('tr', { 'data-token': t.tokenName },
          el('td', {}, t.tokenName), el('td', {}, t.appNames && t.appNames.length ? t.appNames.join(', ') : 'the whole org'),
          el('td', {}, when(t.createdAt)),
          el('td', {}, el('button', {
            type: 'button',
            onclick: async () => {
              if (!window.confirm(`Revoke key ${t.tokenName}? Executors using it are disconnected.`)) return;
              try {
                await api(`tokens/${encodeURIComponent(t.tokenName)}`, { method: 'DELETE' });
                await load();
              } catch (err) {
                say(error, err);
              }
            },
          }, 'Revoke')))));
        if (!tokens.length) fill($('tokens').tBodies[0], el('tr', {}, el('td', { colspan: 4 }, 'No key.')));
      } catch (err) {
        fill($('tokens').tBodies[0], el('tr', {}, el('td', { colspan: 4, class: 'error' }, err.message)));
      }
    }
    $('new-token').addEventListener('submit', async (event) => {
      event.preventDefault();
      error.textContent = '';
      const apps = $('token-apps').value.split(',').map((a) => a.trim()).filter(Boolean);
      try {
        const created = await api(`tokens/${encodeURIComponent($('token-name').value)}`,
          { method: 'POST', body: { appNames: apps.length ? apps : null } });
        $('secret').hidden = false;
        $('secret-value').textContent = created.token;  // shown here once; never stored by the console
        $('token-name').value = '';
        await load();
      } catch (err) {
        say(error, err);
      }
    });
    await load();
  }

  // -- the audit log ------------------------------------------------------------------------------------------

  async function auditPage() {
    let following = null;
    const search = pagedSearch($('audit-filters'), async (params, offset) => {
      const query = new URLSearchParams({ limit: String(PAGE_SIZE + 1), offset: String(offset) });
      for (const name of ['operation', 'target', 'subject']) if (params.get(name)) query.set(name, params.get(name));
      for (const name of ['startTime', 'endTime']) {
        if (params.get(name)) query.set(name, new Date(params.get(name)).toISOString());
      }
      const body = $('audit').tBodies[0];
      try {
        const rows = await api(`audit-logs?${query}`);
        const page = rows.slice(0, PAGE_SIZE);
        fill(body, ...page.map((r) => el('tr', { 'data-operation': r.operation },
          el('td', {}, when(r.emitTime)), el('td', {}, r.operation),
          el('td', { class: r.status === 'failure' ? 'failed' : null }, r.status),
          el('td', {}, `${r.target.type} ${r.target.id}`),
          el('td', {}, r.subject.display || `${r.subject.type} ${r.subject.id}`),
          el('td', {}, el('code', {}, r.details ? JSON.stringify(r.details) : '')))));
        if (!page.length) fill(body, el('tr', {}, el('td', { colspan: 6 }, 'Nothing matches.')));
        return rows.length;
      } catch (err) {
        fill(body, el('tr', {}, el('td', { colspan: 6, class: 'error' }, err.message)));
        return null;
      }
    });
    $('follow').addEventListener('change', (event) => {  // the newest page, read again every second
      clearInterval(following);
      following = null;
      if (event.target.checked) {
        search.go(0);
        following = setInterval(() => { if (!document.hidden && search.offset === 0) search.load(); }, POLL_MS);
        polls.push(following);
      }
    });
    await search.load();
  }

  const PAGES = {
    apps: appsPage, app: appPage, workflows: workflowsPage, workflow: workflowPage, queues: queuesPage,
    alerts: alertsPage, keys: keysPage, audit: auditPage,
  };

  if (session.getItem(KEY)) signedIn();
  else signOut('');
})();
