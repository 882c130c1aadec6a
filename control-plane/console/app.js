// The LAP console: one ES module, no framework, no build step. It talks only to its own origin:
// the REST API (/api/v1/…, authorised by the sign-in cookie; writes carry the CSRF token), the
// console's sign-in (/console/session), the sessions' event streams (SSE) and their terminal
// WebSocket. The master key is sent once, at sign-in, and never kept. Pages are hash routes:
// #/agents, #/agents/new, #/agents/{id}, #/sessions, #/sessions/{id}, #/secrets, #/platform.
// docs/console.md describes the pages and the security model.

import { Terminal } from './vendor/xterm/xterm.mjs';
import { FitAddon } from './vendor/xterm/addon-fit.mjs';

const API = '/api/v1/managed_agents';
const SECRETS = '/api/v1/secrets';
const HARNESSES = ['claude-code', 'codex', 'opencode', 'claude-agent-sdk'];
/** Harnesses without a terminal UI: messages only. */
const NO_TUI = new Set(['claude-agent-sdk']);
const REDACTED = '<redacted>';

// xterm.js draws its theme and cell sizes with <style> elements; the page's Content-Security-
// Policy applies only style elements that carry this response's nonce, so every one made here
// gets it (nonces are readable from script only, never from the markup).
const styleNonce = document.querySelector('meta[property="csp-nonce"]')?.nonce ?? '';
{
  const createElement = Document.prototype.createElement;
  Document.prototype.createElement = function (name, options) {
    const el = createElement.call(this, name, options);
    if (el instanceof HTMLStyleElement) el.nonce = styleNonce;
    return el;
  };
}

// ---- DOM ----

const PROPS = new Set(['value', 'checked', 'disabled', 'hidden', 'readOnly', 'selected', 'required']);

/** An element: props are attributes (properties for form state, listeners for on*), children text or nodes. */
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (PROPS.has(k)) el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

const main = document.getElementById('main');
const nav = document.getElementById('nav');

function ago(iso) {
  if (!iso) return '';
  const s = Math.round((Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.max(s, 0)}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

function badge(status) {
  return h('span', { class: `badge ${status}`, 'data-status': status }, status);
}

const lines = (text) => text.split(/[\n,]/).map((s) => s.trim()).filter(Boolean);

// ---- the API ----

/** The sign-in's CSRF token, in memory only (the page gets it again after a reload). */
let csrf = null;

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** A JSON request to this origin; a 4xx/5xx throws its `{"error"}` message. */
async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (method !== 'GET' && csrf) headers['x-csrf-token'] = csrf;
  let r;
  try {
    r = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'same-origin',
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, `cannot reach lap-server (${e.message})`);
  }
  const text = await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!r.ok) {
    const message = (data && data.error) || `${r.status} ${r.statusText}`;
    if (r.status === 401 && csrf && !path.startsWith('/console/session')) signedOut(message);
    throw new ApiError(r.status, message);
  }
  return data;
}

/** All items of a list endpoint (pages of 200). */
async function all(path) {
  const out = [];
  for (let offset = 0; ; offset += 200) {
    const sep = path.includes('?') ? '&' : '?';
    const page = await api('GET', `${path}${sep}limit=200&offset=${offset}`);
    out.push(...page.data);
    if (out.length >= page.total || page.data.length === 0) return out;
  }
}

// ---- forms: each field has a slot for the API's message that names it ----

/** The field a 400's message names: `name: …`, `env_vars.KEY: …`, `allow_out[2]: …`. */
function fieldOf(message) {
  const m = /^([A-Za-z_]+)(?:[.[][^:]*)?:\s/.exec(message ?? '');
  return m ? m[1] : null;
}

let fieldIds = 0;

/** A labelled input (or group of inputs) with a slot for the message that names it. */
function field(name, label, input, hint) {
  input.dataset.input = name;
  const control = input.matches('input, select, textarea');
  if (control && !input.id) input.id = `f-${name}-${++fieldIds}`;
  return h(
    'div',
    { class: 'field', 'data-field': name },
    h(control ? 'label' : 'div', { class: control ? null : 'label', for: control ? input.id : null }, label, hint ? h('span', { class: 'hint' }, ` ${hint}`) : null),
    input,
    h('p', { class: 'field-error', 'data-error-for': name, role: 'alert' }),
  );
}

function clearErrors(form) {
  form.querySelectorAll('.field-error, .form-error').forEach((e) => (e.textContent = ''));
  form.querySelectorAll('.invalid').forEach((e) => e.classList.remove('invalid'));
}

/** Show `err` next to the field it names (`aliases` maps API fields to form fields), else on the form. */
function showError(form, err, aliases = {}) {
  clearErrors(form);
  const name = fieldOf(err.message);
  const target = aliases[name] ?? name;
  const slot = target && form.querySelector(`[data-error-for="${target}"]`);
  if (slot) {
    slot.textContent = err.message;
    const input = form.querySelector(`[data-input="${target}"]`);
    input?.classList.add('invalid');
    (input?.matches('input, select, textarea') ? input : input?.querySelector('input, select, textarea'))?.focus();
  } else {
    form.querySelector('.form-error').textContent = err.message;
  }
}

/** Rows of KEY / value / hosts inputs; values are write-only (password inputs, never filled in). */
function envRows(existing = {}, hostsOf = {}, { keepHint } = {}) {
  const box = h('div', { class: 'env-rows' });
  const add = (key = '', stored = false) =>
    box.append(
      h(
        'div',
        { class: 'kv' },
        h('input', { placeholder: 'KEY', value: key, 'aria-label': 'name', 'data-role': 'key', 'data-stored': stored ? '1' : null }),
        h('input', {
          type: 'password',
          placeholder: stored ? keepHint : 'value (write-only)',
          'aria-label': 'value',
          'data-role': 'value',
          autocomplete: 'off',
        }),
        h('input', {
          placeholder: 'hosts (comma-separated; optional for well-known names)',
          value: (hostsOf[key] ?? []).join(', '),
          'aria-label': 'hosts',
          'data-role': 'hosts',
        }),
        h('button', { type: 'button', class: 'link', onclick: (e) => e.target.closest('.kv').remove() }, 'Remove'),
      ),
    );
  for (const k of Object.keys(existing)) add(k, true);
  const wrap = h('div', {}, box, h('button', { type: 'button', class: 'add-row', onclick: () => add() }, 'Add variable'));
  /** `{env_vars, env_var_hosts}` from the rows; an untouched stored value is sent as "<redacted>" (kept). */
  wrap.read = () => {
    const env_vars = {};
    const env_var_hosts = {};
    for (const row of box.querySelectorAll('.kv')) {
      const key = row.querySelector('[data-role=key]').value.trim();
      const value = row.querySelector('[data-role=value]').value;
      const hosts = lines(row.querySelector('[data-role=hosts]').value);
      if (!key && !value) continue;
      env_vars[key] = value === '' && row.querySelector('[data-role=key]').dataset.stored ? REDACTED : value;
      if (hosts.length) env_var_hosts[key] = hosts;
    }
    return { env_vars, env_var_hosts };
  };
  wrap.clearValues = () => box.querySelectorAll('[data-role=value]').forEach((i) => (i.value = ''));
  return wrap;
}

// ---- pages and their lifetimes ----

/** A page's lifetime: timers, streams and sockets end when it is left. */
class Page {
  constructor() {
    this.alive = true;
    this.disposers = [];
  }
  onDispose(fn) {
    this.disposers.push(fn);
  }
  every(ms, fn) {
    const t = setInterval(fn, ms);
    this.onDispose(() => clearInterval(t));
  }
  dispose() {
    this.alive = false;
    for (const fn of this.disposers.splice(0)) {
      try {
        fn();
      } catch (e) {
        console.error(e);
      }
    }
  }
}

/**
 * A session's event stream (`GET /sessions/{id}/events`), reopened when it drops: the browser
 * retries a dropped connection by itself; a refused one (server restarting, 5xx) is retried here.
 * `onState` hears 'live' or 'lost'.
 */
function follow(page, id, { onSession, onAgent, onState }) {
  let es = null;
  let timer = null;
  let closed = false;
  const open = () => {
    if (closed || !page.alive) return;
    es = new EventSource(`${API}/sessions/${encodeURIComponent(id)}/events`);
    es.addEventListener('session', (e) => onSession?.(JSON.parse(e.data)));
    es.addEventListener('agent', (e) => onAgent?.(e.data));
    es.onopen = () => onState?.('live');
    es.onerror = () => {
      onState?.('lost');
      if (es.readyState === EventSource.CLOSED) {
        timer = setTimeout(async () => {
          // A refusal may be a sign-in that ended: api() then shows the sign-in page.
          await api('GET', '/console/session').catch(() => {});
          open();
        }, 2000);
      }
    };
  };
  const close = () => {
    closed = true;
    clearTimeout(timer);
    es?.close();
  };
  page.onDispose(close);
  open();
  return { close };
}

function liveIndicator() {
  const el = h('span', { class: 'live', 'data-live': 'connecting' }, 'connecting…');
  el.set = (state) => {
    el.dataset.live = state;
    el.className = `live ${state === 'live' ? 'ok' : state === 'lost' ? 'lost' : ''}`;
    el.textContent = state === 'live' ? 'live' : state === 'lost' ? 'connection lost — reconnecting…' : state;
  };
  return el;
}

// ---- agents ----

async function agentsPage(page) {
  const agents = await all(`${API}/agents`);
  if (!page.alive) return;
  const body = agents.length
    ? h(
        'table',
        {},
        h('thead', {}, h('tr', {}, ['Name', 'Harness', 'Model', 'Repository', 'Registry secrets', 'Egress', ''].map((t) => h('th', {}, t)))),
        h(
          'tbody',
          {},
          agents.map((a) =>
            h(
              'tr',
              { 'data-agent': a.name },
              h('td', {}, h('a', { href: `#/agents/${a.id}` }, a.name), h('div', { class: 'muted mono' }, a.id)),
              h('td', {}, a.harness_id),
              h('td', {}, a.model ?? h('span', { class: 'muted' }, 'default')),
              h('td', { class: 'mono' }, a.repo_url ? `${a.repo_url}${a.branch ? ` (${a.branch})` : ''}` : ''),
              h('td', { class: 'mono' }, (a.secrets ?? []).join(', ')),
              h('td', {}, egressSummary(a)),
              h(
                'td',
                { class: 'actions' },
                h('a', { class: 'button', href: `#/sessions?agent=${a.id}` }, 'Start session'),
                ' ',
                h('a', { class: 'button', href: `#/agents/${a.id}` }, 'Edit'),
                ' ',
                confirmButton('Delete', `Delete ${a.name}?`, async () => {
                  await api('DELETE', `${API}/agents/${a.id}`);
                  route();
                }),
              ),
            ),
          ),
        ),
      )
    : h('p', { class: 'empty' }, 'No agents yet.');
  main.replaceChildren(
    h('div', { class: 'row spread' }, h('h1', {}, 'Agents'), h('a', { class: 'button', href: '#/agents/new' }, 'New agent')),
    h('div', { class: 'panel' }, body),
  );
}

function egressSummary(a) {
  const parts = [];
  if (a.allow_out?.length) parts.push(`allow ${a.allow_out.join(', ')}`);
  if (a.deny_out?.length) parts.push(`deny ${a.deny_out.join(', ')}`);
  return parts.length ? parts.join('; ') : h('span', { class: 'muted' }, 'bound hosts only');
}

/** A button that asks once more in place before doing `action`; errors show beside it. */
function confirmButton(label, question, action) {
  const err = h('span', { class: 'field-error' });
  const btn = h('button', { type: 'button', class: 'danger' }, label);
  let armed = null;
  btn.addEventListener('click', async () => {
    if (!armed) {
      btn.textContent = question;
      armed = setTimeout(() => {
        armed = null;
        btn.textContent = label;
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    btn.disabled = true;
    try {
      await action();
    } catch (e) {
      err.textContent = e.message;
      btn.disabled = false;
      btn.textContent = label;
    }
  });
  return h('span', {}, btn, err);
}

async function agentFormPage(page, id) {
  const editing = id && id !== 'new';
  const [agent, registry] = await Promise.all([
    editing ? api('GET', `${API}/agents/${encodeURIComponent(id)}`) : null,
    all(SECRETS),
  ]);
  if (!page.alive) return;
  const a = agent ?? { harness_id: 'claude-code', allow_out: [], deny_out: [], secrets: [], env_vars: {}, env_var_hosts: {} };
  const text = (name, value, attrs = {}) => h('input', { name, value: value ?? '', ...attrs });
  const area = (name, value, attrs = {}) => h('textarea', { name, ...attrs }, value ?? '');
  const harness = h('select', { name: 'harness_id' }, HARNESSES.map((x) => h('option', { value: x, selected: x === a.harness_id }, x)));
  const secrets = h(
    'div',
    { class: 'checks' },
    registry.length
      ? registry.map((s) =>
          h('label', {}, h('input', { type: 'checkbox', value: s.name, checked: a.secrets.includes(s.name) }), s.name),
        )
      : h('span', { class: 'muted' }, 'The registry is empty: add secrets on the Secrets page.'),
  );
  const env = envRows(a.env_vars, a.env_var_hosts, { keepHint: 'unchanged (write-only)' });
  const form = h(
    'form',
    { class: 'panel', novalidate: true },
    h(
      'div',
      { class: 'grid' },
      field('name', 'Name', text('name', a.name, { required: true, autocomplete: 'off' })),
      field('harness_id', 'Harness', harness),
      field('model', 'Model', text('model', a.model, { placeholder: "the agent CLI's default" })),
      field('repo_url', 'Repository', text('repo_url', a.repo_url, { placeholder: 'https://github.com/org/repo.git' })),
      field('branch', 'Branch', text('branch', a.branch, { placeholder: 'the default branch' })),
      h('div', { class: 'wide' }, field('prompt', 'Prompt', area('prompt', a.prompt, { rows: 3 }), 'the agent’s standing instructions')),
      h('div', { class: 'wide' }, field('secrets', 'Registry secrets', secrets, 'given to every session as stubs')),
      field('allow_out', 'Egress allowed', area('allow_out', a.allow_out.join('\n')), 'one host, *.suffix, IP or CIDR a line; empty: any'),
      field('deny_out', 'Egress denied', area('deny_out', a.deny_out.join('\n')), 'wins over allowed'),
      h('div', { class: 'wide' }, field('env_vars', 'Agent secrets (env_vars)', env, 'values are write-only')),
    ),
    h('p', { class: 'form-error', role: 'alert' }),
    h(
      'div',
      { class: 'buttons' },
      h('button', { type: 'submit', class: 'primary' }, editing ? 'Save' : 'Create agent'),
      h('a', { class: 'button', href: '#/agents' }, 'Cancel'),
    ),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const v = (n) => form.elements[n].value.trim();
    const opt = (n) => v(n) || (editing ? null : undefined);
    const { env_vars, env_var_hosts } = env.read();
    const body = {
      name: v('name'),
      harness_id: harness.value,
      model: opt('model'),
      repo_url: opt('repo_url'),
      branch: opt('branch'),
      prompt: form.elements.prompt.value.trim() || (editing ? null : undefined),
      allow_out: lines(form.elements.allow_out.value),
      deny_out: lines(form.elements.deny_out.value),
      secrets: [...secrets.querySelectorAll('input:checked')].map((i) => i.value),
      env_vars,
      env_var_hosts,
    };
    try {
      if (editing) await api('PATCH', `${API}/agents/${encodeURIComponent(id)}`, body);
      else await api('POST', `${API}/agents`, body);
      env.clearValues();
      location.hash = '#/agents';
    } catch (err) {
      showError(form, err, { env_var_hosts: 'env_vars' });
    }
  });
  main.replaceChildren(h('h1', {}, editing ? `Agent ${a.name}` : 'New agent'), form);
  form.elements.name.focus();
}

// ---- sessions ----

async function sessionsPage(page, _id, params) {
  const [agents, sessions] = await Promise.all([all(`${API}/agents`), api('GET', `${API}/sessions?limit=100`)]);
  if (!page.alive) return;
  const names = Object.fromEntries(agents.map((a) => [a.id, a.name]));
  const live = liveIndicator();
  const tbody = h('tbody');
  const rows = new Map();

  const render = (s) => {
    const row = h(
      'tr',
      { 'data-session': s.id },
      h('td', {}, h('a', { href: `#/sessions/${s.id}`, class: 'mono' }, s.id)),
      h('td', {}, names[s.agent_id] ?? s.agent_id),
      h('td', {}, s.title ?? ''),
      h('td', {}, badge(s.status)),
      h('td', { class: 'mono' }, s.phase),
      h('td', { class: 'reason' }, s.failure_reason ?? ''),
      h('td', { title: s.last_seen_at }, ago(s.last_seen_at)),
      h(
        'td',
        { class: 'actions' },
        h('a', { class: 'button', href: `#/sessions/${s.id}` }, 'Open'),
        ' ',
        s.status === 'dead' || s.status === 'failed'
          ? null
          : h('button', { type: 'button', class: 'danger', onclick: () => stopSession(s.id).catch((e) => alertIn(row, e)) }, 'Stop'),
      ),
    );
    const old = rows.get(s.id);
    if (old) old.replaceWith(row);
    else tbody.append(row);
    rows.set(s.id, row);
  };
  sessions.data.forEach(render);

  // Live: the event streams of up to four unfinished sessions (a browser keeps six connections
  // per server); the list itself is re-read every 10 s.
  const followed = new Map();
  const followSome = (list) => {
    for (const s of list) {
      if (followed.size >= 4) break;
      if (followed.has(s.id) || s.status === 'dead' || s.status === 'failed') continue;
      const f = follow(page, s.id, {
        onSession: (v) => {
          render(v);
          if (v.status === 'dead' || v.status === 'failed') {
            f.close();
            followed.delete(v.id);
          }
        },
        onState: (st) => live.set(st),
      });
      followed.set(s.id, f);
    }
    if (followed.size === 0) live.set('live');
  };
  followSome(sessions.data);
  page.every(10000, async () => {
    try {
      const fresh = await api('GET', `${API}/sessions?limit=100`);
      if (!page.alive) return;
      fresh.data.forEach(render);
      followSome(fresh.data);
    } catch {
      live.set('lost');
    }
  });

  main.replaceChildren(
    h('h1', {}, 'Sessions'),
    startForm(agents, params.get('agent')),
    h(
      'div',
      { class: 'panel' },
      h('div', { class: 'row spread' }, h('h2', {}, 'All sessions'), live),
      sessions.data.length || agents.length
        ? h(
            'table',
            {},
            h('thead', {}, h('tr', {}, ['Session', 'Agent', 'Title', 'Status', 'Phase', 'Failure', 'Last seen', ''].map((t) => h('th', {}, t)))),
            tbody,
          )
        : h('p', { class: 'empty' }, 'No sessions yet.'),
    ),
  );
}

function alertIn(el, err) {
  const slot = el.querySelector('.field-error') ?? el.appendChild(h('p', { class: 'field-error' }));
  slot.textContent = err.message;
}

async function stopSession(id) {
  await api('DELETE', `${API}/sessions/${encodeURIComponent(id)}`);
}

function startForm(agents, preselect) {
  if (!agents.length) {
    return h('div', { class: 'panel' }, h('p', {}, 'Create an agent first: ', h('a', { href: '#/agents/new' }, 'New agent'), '.'));
  }
  const agent = h(
    'select',
    { name: 'agent' },
    agents.map((a) => h('option', { value: a.id, selected: a.id === preselect }, `${a.name} (${a.harness_id})`)),
  );
  const env = envRows();
  const form = h(
    'form',
    { class: 'panel', novalidate: true, id: 'start-session' },
    h('h2', {}, 'Start a session'),
    h(
      'div',
      { class: 'grid' },
      field('agent', 'Agent', agent),
      field('title', 'Title', h('input', { name: 'title', placeholder: 'optional' })),
      h('div', { class: 'wide' }, field('initial_prompt', 'First prompt', h('textarea', { name: 'initial_prompt', rows: 2, placeholder: 'optional' }))),
      h(
        'div',
        { class: 'wide' },
        field('env_vars', 'Session secrets (env_vars)', env, 'this session only; values reach the vault, never the database or the agent'),
      ),
    ),
    h('p', { class: 'form-error', role: 'alert' }),
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Start session')),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const { env_vars, env_var_hosts } = env.read();
    const body = { env_vars, env_var_hosts };
    if (form.elements.title.value.trim()) body.title = form.elements.title.value.trim();
    if (form.elements.initial_prompt.value.trim()) body.initial_prompt = form.elements.initial_prompt.value.trim();
    try {
      const s = await api('POST', `${API}/agents/${encodeURIComponent(agent.value)}/session`, body);
      env.clearValues();
      location.hash = `#/sessions/${s.id}`;
    } catch (err) {
      showError(form, err, { env_var_hosts: 'env_vars' });
    }
  });
  return form;
}

async function sessionPage(page, id) {
  let s = await api('GET', `${API}/sessions/${encodeURIComponent(id)}`);
  const agent = await api('GET', `${API}/agents/${encodeURIComponent(s.agent_id)}`).catch(() => null);
  if (!page.alive) return;
  const harness = agent?.harness_id ?? '';
  const live = liveIndicator();
  const facts = h('dl', { class: 'facts' });
  const head = h('div', { class: 'row spread' });
  const termPanel = h('div', { class: 'panel term-panel', hidden: NO_TUI.has(harness) });
  const audit = h('div', { class: 'panel' });
  const activity = h('ol', { class: 'mono activity' }, h('li', { class: 'muted', 'data-empty': '' }, 'nothing yet: events appear while the agent works on a message'));
  let terminal = null;

  const renderHead = () => {
    head.replaceChildren(
      h('h1', {}, s.title || s.id, ' ', badge(s.status)),
      h(
        'div',
        { class: 'row' },
        live,
        s.status === 'dead' || s.status === 'failed'
          ? null
          : h('button', { type: 'button', class: 'danger', id: 'stop', onclick: () => stopSession(s.id).catch((e) => alertIn(head, e)) }, 'Stop session'),
      ),
    );
    const fact = (k, v) => [h('dt', {}, k), h('dd', {}, v ?? '')];
    facts.replaceChildren(
      ...fact('Session', h('span', { class: 'mono' }, s.id)),
      ...fact('Agent', agent ? h('a', { href: `#/agents/${agent.id}` }, `${agent.name} (${harness})`) : s.agent_id),
      ...fact('Status', h('span', { 'data-fact': 'status' }, s.status)),
      ...fact('Phase', h('span', { class: 'mono', 'data-fact': 'phase' }, s.phase)),
      ...(s.failure_reason ? fact('Failure', h('span', { class: 'reason', 'data-fact': 'failure_reason' }, s.failure_reason)) : []),
      ...fact('Created', h('span', { title: s.created_at }, ago(s.created_at))),
      ...fact('Last seen', h('span', { title: s.last_seen_at }, ago(s.last_seen_at))),
      ...fact('Idle timeout', `${Math.round(s.idle_timeout_ms / 60000)} min`),
    );
  };

  const renderTerminal = () => {
    if (NO_TUI.has(harness)) return;
    if (s.status === 'ready' && !terminal) {
      const status = h('span', { class: 'live' });
      const again = h('button', { type: 'button', class: 'link', hidden: true }, 'Reconnect');
      const screen = h('div', { class: 'terminal', id: 'terminal' });
      termPanel.replaceChildren(h('div', { class: 'term-bar' }, h('span', {}, 'Terminal — ', status), again), screen);
      terminal = terminalView(page, screen, status, again, s);
    } else if (s.status !== 'ready' && terminal) {
      terminal.stop(`the session is ${s.status}`);
    } else if (!terminal) {
      termPanel.replaceChildren(
        h('div', { class: 'term-bar' }, h('span', {}, 'Terminal')),
        h('p', { class: 'muted notice' }, s.status === 'creating' ? `The terminal opens when the session is ready (now: ${s.phase}).` : `The session is ${s.status}.`),
      );
    }
  };

  const loadAudit = async () => {
    if (s.status !== 'ready') {
      audit.replaceChildren(h('h2', {}, 'Interceptions (the vault’s audit)'), h('p', { class: 'empty' }, 'Shown while the session is ready.'));
      return;
    }
    try {
      const events = await api('GET', `${API}/sessions/${encodeURIComponent(s.id)}/interceptions`);
      if (!page.alive) return;
      audit.replaceChildren(h('h2', {}, 'Interceptions (the vault’s audit)'), auditTable(events));
    } catch (e) {
      audit.replaceChildren(h('h2', {}, 'Interceptions (the vault’s audit)'), h('p', { class: 'notice bad' }, e.message));
    }
  };

  const onSession = (v) => {
    const was = s.status;
    s = v;
    renderHead();
    renderTerminal();
    if (was !== s.status) loadAudit();
  };
  renderHead();
  renderTerminal();
  loadAudit();
  page.every(5000, loadAudit);
  const events = follow(page, s.id, {
    onSession: (v) => {
      onSession(v);
      if (v.status === 'dead' || v.status === 'failed') {
        events.close();
        live.set('ended');
      }
    },
    onAgent: (data) => {
      activity.querySelector('[data-empty]')?.remove();
      activity.prepend(h('li', {}, agentEventLine(data)));
      while (activity.children.length > 50) activity.lastChild.remove();
    },
    onState: (st) => live.set(st),
  });

  main.replaceChildren(
    head,
    h('div', { class: 'panel' }, facts),
    termPanel,
    messagePanel(s, harness),
    audit,
    h('div', { class: 'panel' }, h('h2', {}, 'Agent activity'), h('p', { class: 'muted' }, 'The agent CLI’s own events, newest first.'), activity),
  );
}

/** One line for an agent event (claude stream-json, codex --json, …). */
function agentEventLine(data) {
  let e;
  try {
    e = JSON.parse(data);
  } catch {
    return data;
  }
  const text = eventText(e);
  return `${e.type ?? 'event'}${e.subtype ? `/${e.subtype}` : ''}${text ? `: ${text.slice(0, 200)}` : ''}`;
}

/** The assistant text an agent event carries, if any. */
function eventText(e) {
  if (e.type === 'assistant' && Array.isArray(e.message?.content)) {
    return e.message.content.filter((c) => c.type === 'text').map((c) => c.text).join('');
  }
  if (e.item?.type === 'agent_message' && e.item.text) return e.item.text;
  if (e.type === 'result' && typeof e.result === 'string') return e.result;
  return '';
}

function auditTable(events) {
  if (!Array.isArray(events) || events.length === 0) return h('p', { class: 'empty' }, 'No intercepted requests yet.');
  const injected = (e) => (e.injected ?? []).map((i) => `${i.secret} (${i.location})`).join(', ');
  const blocked = (e) => [e.blocked, e.blocked_secret, e.error].filter(Boolean).join(': ');
  return h(
    'table',
    { class: 'audit' },
    h('thead', {}, h('tr', {}, ['Time', 'Request', 'Status', 'Secrets injected', 'Blocked', 'Bytes ↑/↓', 'ms'].map((t) => h('th', {}, t)))),
    h(
      'tbody',
      {},
      [...events].reverse().map((e) =>
        h(
          'tr',
          {},
          h('td', { title: e.time }, ago(e.time)),
          h('td', { class: 'mono' }, `${e.method} ${e.host}${e.port && e.port !== 443 ? `:${e.port}` : ''}${e.path}`),
          h('td', {}, e.status),
          h('td', { class: 'mono' }, injected(e)),
          h('td', { class: 'reason' }, blocked(e)),
          h('td', {}, `${e.bytes_up ?? 0} / ${e.bytes_down ?? 0}`),
          h('td', {}, Math.round((e.duration_us ?? 0) / 1000)),
        ),
      ),
    ),
  );
}

/**
 * The agent's terminal in xterm.js over the session's tty WebSocket: raw bytes both ways,
 * `resize` on every size change, a `ping` every 30 s. A dropped connection says so and is
 * retried (1, 2, 4, 8 s…) while the session is ready; each attach repaints the current screen.
 */
function terminalView(page, screen, status, again, session) {
  const term = new Terminal({
    cursorBlink: true,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
    fontSize: 13,
    scrollback: 5000,
    theme: { background: '#0d1117' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  const refit = () => {
    try {
      fit.fit();
    } catch {
      // not laid out yet
    }
  };
  refit();
  const encoder = new TextEncoder();
  let ws = null;
  let attempts = 0;
  let timer = null;
  let pinger = null;
  let stopped = false;
  const say = (text, state) => {
    status.textContent = text;
    status.dataset.state = state;
    status.className = `live ${state === 'connected' ? 'ok' : state === 'lost' ? 'lost' : ''}`;
  };
  const send = (data) => ws?.readyState === WebSocket.OPEN && ws.send(data);
  const sendResize = () => send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));

  const connect = () => {
    clearTimeout(timer);
    if (stopped || !page.alive) return;
    again.hidden = true;
    say(attempts ? 'reconnecting…' : 'connecting…', 'connecting');
    const url = new URL(session.tty_url, location.href);
    url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    url.searchParams.set('token', session.tty_token);
    url.searchParams.set('cols', term.cols);
    url.searchParams.set('rows', term.rows);
    const sock = new WebSocket(url);
    sock.binaryType = 'arraybuffer';
    ws = sock;
    let exited = null;
    sock.onopen = () => {
      attempts = 0;
      say('connected', 'connected');
      term.reset();
      sendResize();
      pinger = setInterval(() => send(JSON.stringify({ type: 'ping' })), 30000);
      term.focus();
    };
    sock.onmessage = (e) => {
      if (typeof e.data !== 'string') {
        term.write(new Uint8Array(e.data));
        return;
      }
      let m;
      try {
        m = JSON.parse(e.data);
      } catch {
        return;
      }
      if (m.type === 'exit') exited = m.code;
      else if (m.type === 'error') say(`terminal: ${m.error}`, 'lost');
    };
    sock.onclose = async (e) => {
      clearInterval(pinger);
      if (ws !== sock || stopped) return;
      ws = null;
      if (exited !== null) {
        say(`the agent exited (code ${exited}); Reconnect starts it again`, 'exited');
        again.hidden = false;
        return;
      }
      if (e.code === 1001) {
        say('the session is stopping', 'ended');
        return;
      }
      // Dropped or refused: try again while the session is ready.
      let now = null;
      try {
        now = await api('GET', `${API}/sessions/${encodeURIComponent(session.id)}`);
      } catch (err) {
        if (err.status === 404 || err.status === 401) {
          say(err.message, 'ended');
          return;
        }
      }
      if (stopped || !page.alive) return;
      if (now && now.status !== 'ready') {
        say(`the session is ${now.status}`, 'ended');
        return;
      }
      attempts += 1;
      const delay = Math.min(8, 2 ** (attempts - 1));
      say(`connection lost — reconnecting in ${delay}s`, 'lost');
      again.hidden = false;
      timer = setTimeout(connect, delay * 1000);
    };
  };

  term.onData((d) => send(encoder.encode(d)));
  term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(sendResize);
  const observer = new ResizeObserver(refit);
  observer.observe(screen);
  again.addEventListener('click', () => {
    attempts = 0;
    connect();
  });
  connect();
  const stop = (why) => {
    stopped = true;
    clearTimeout(timer);
    clearInterval(pinger);
    ws?.close();
    ws = null;
    again.hidden = true;
    if (why) say(why, 'ended');
  };
  page.onDispose(() => {
    stop();
    observer.disconnect();
    term.dispose();
  });
  return { stop };
}

/** A message box: `POST /sessions/{id}/message_stream`, the reply shown as its events arrive. */
function messagePanel(session, harness) {
  const input = h('textarea', { name: 'text', rows: 2, placeholder: 'Ask the agent something' });
  const reply = h('div', { class: 'reply', id: 'reply', 'aria-live': 'polite' });
  const form = h(
    'form',
    { class: 'panel', id: 'message', novalidate: true },
    h('h2', {}, NO_TUI.has(harness) ? 'Message' : 'Message (runs the agent non-interactively, beside its terminal)'),
    field('text', 'Text', input),
    h('p', { class: 'form-error', role: 'alert' }),
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Send')),
    reply,
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    clearErrors(form);
    const button = form.querySelector('button[type=submit]');
    button.disabled = true;
    reply.textContent = '';
    try {
      await streamMessage(session.id, input.value, (t) => (reply.textContent = t));
      input.value = '';
    } catch (err) {
      showError(form, err);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

async function streamMessage(id, text, show) {
  let r;
  try {
    r = await fetch(`${API}/sessions/${encodeURIComponent(id)}/message_stream`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-csrf-token': csrf },
      body: JSON.stringify({ text }),
      credentials: 'same-origin',
    });
  } catch (e) {
    throw new ApiError(0, `cannot reach lap-server (${e.message})`);
  }
  if (!r.ok) {
    const d = await r.json().catch(() => ({}));
    if (r.status === 401) signedOut(d.error);
    throw new ApiError(r.status, d.error ?? `${r.status} ${r.statusText}`);
  }
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let streamed = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    for (let m = /\r?\n\r?\n/.exec(buf); m; m = /\r?\n\r?\n/.exec(buf)) {
      const raw = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      const ev = { event: 'message', data: [] };
      for (const line of raw.split(/\r?\n/)) {
        if (line.startsWith('event:')) ev.event = line.slice(6).trim();
        else if (line.startsWith('data:')) ev.data.push(line.slice(5).replace(/^ /, ''));
      }
      const data = ev.data.join('\n');
      // LAP's frames: ready, harness_event (the CLI's own events), done, error.
      if (ev.event === 'harness_event' || ev.event === 'agent') {
        try {
          const t = eventText(JSON.parse(data));
          if (t) show((streamed += t));
        } catch {
          // not JSON: not shown
        }
      } else if (ev.event === 'done' || ev.event === 'message') {
        const parts = JSON.parse(data).parts ?? [];
        show(parts.filter((p) => p.type === 'text').map((p) => p.text).join('\n') || streamed);
      } else if (ev.event === 'error') {
        let msg = data;
        try {
          msg = JSON.parse(data).error ?? data;
        } catch {
          // plain text
        }
        throw new ApiError(502, msg);
      }
    }
  }
}

// ---- secrets ----

async function secretsPage(page) {
  const secrets = await all(SECRETS);
  if (!page.alive) return;
  // Credential surfaces (docs/sidecar.md): empty means the vault's default, `header`.
  const surfacesInput = (chosen = []) =>
    h('input', {
      name: 'locations',
      value: chosen.join(', '),
      placeholder: 'header, header:x-api-key, query:key, body:POST /oauth/token',
      autocomplete: 'off',
    });

  const table = secrets.length
    ? h(
        'table',
        {},
        h('thead', {}, h('tr', {}, ['Name', 'Value', 'Hosts', 'Locations', 'Updated', ''].map((t) => h('th', {}, t)))),
        h(
          'tbody',
          {},
          secrets.map((s) => {
            const row = h(
              'tr',
              { 'data-secret': s.name },
              h('td', { class: 'mono' }, s.name),
              h('td', { class: 'muted' }, 'write-only'),
              h('td', { class: 'mono' }, s.hosts.join(', ')),
              h('td', {}, s.locations.length ? s.locations.join(', ') : h('span', { class: 'muted' }, 'header (default)')),
              h('td', { title: s.updated_at }, ago(s.updated_at)),
              h(
                'td',
                { class: 'actions' },
                h('button', { type: 'button', onclick: () => row.after(rotateRow(s, surfacesInput)) }, 'Rotate'),
                ' ',
                confirmButton('Delete', `Delete ${s.name}?`, async () => {
                  await api('DELETE', `${SECRETS}/${encodeURIComponent(s.name)}`);
                  route();
                }),
              ),
            );
            return row;
          }),
        ),
      )
    : h('p', { class: 'empty' }, 'No secrets in the registry.');

  const locations = surfacesInput();
  const form = h(
    'form',
    { class: 'panel', novalidate: true, id: 'new-secret' },
    h('h2', {}, 'Set a secret'),
    h(
      'div',
      { class: 'grid' },
      field('name', 'Name', h('input', { name: 'name', placeholder: 'GITHUB_TOKEN', autocomplete: 'off' })),
      field('value', 'Value', h('input', { name: 'value', type: 'password', autocomplete: 'off' }), 'write-only'),
      field('hosts', 'Hosts', h('input', { name: 'hosts', placeholder: 'github.com, api.github.com' }), 'the only hosts it is sent to'),
      field('locations', 'Surfaces', locations, 'where the stub is swapped; empty: the credential headers'),
    ),
    h('p', { class: 'form-error', role: 'alert' }),
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Set secret')),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = form.elements;
    try {
      await api('POST', SECRETS, { name: f.name.value.trim(), value: f.value.value, hosts: lines(f.hosts.value), locations: lines(locations.value) });
      f.value.value = '';
      route();
    } catch (err) {
      showError(form, err);
    }
  });
  main.replaceChildren(
    h('h1', {}, 'Secrets'),
    h('p', { class: 'muted' }, 'The registry: agents name these; sessions get stubs, the vault swaps in the value toward its hosts only. Rotating reaches running sessions.'),
    h('div', { class: 'panel' }, table),
    form,
  );
}

function rotateRow(s, surfacesInput) {
  const locations = surfacesInput(s.locations);
  const form = h(
    'form',
    { novalidate: true, class: 'rotate' },
    h(
      'div',
      { class: 'grid' },
      field('value', 'New value', h('input', { name: 'value', type: 'password', autocomplete: 'off' })),
      field('hosts', 'Hosts', h('input', { name: 'hosts', value: s.hosts.join(', ') })),
      field('locations', 'Surfaces', locations),
    ),
    h('p', { class: 'form-error', role: 'alert' }),
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, `Rotate ${s.name}`)),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      await api('PUT', `${SECRETS}/${encodeURIComponent(s.name)}`, {
        value: form.elements.value.value,
        hosts: lines(form.elements.hosts.value),
        locations: lines(locations.value),
      });
      route();
    } catch (err) {
      showError(form, err);
    }
  });
  return h('tr', {}, h('td', { colspan: 6 }, form));
}

// ---- platform ----

async function platformPage(page) {
  const box = h('div');
  const load = async () => {
    const [health, platform, metrics] = await Promise.all([
      fetch('/health', { cache: 'no-store' })
        .then((r) => r.json())
        .catch((e) => ({ status: 'unreachable', error: e.message })),
      api('GET', '/console/platform'),
      fetch('/metrics', { cache: 'no-store' })
        .then((r) => r.text())
        .catch(() => ''),
    ]);
    if (!page.alive) return;
    const m = parseMetrics(metrics);
    const stat = (value, label) => h('div', { class: 'stat' }, h('b', {}, value), h('span', {}, label));
    const byStatus = m.filter((x) => x.name === 'lap_sessions');
    box.replaceChildren(
      h(
        'div',
        { class: 'panel' },
        h('h2', {}, 'Server'),
        h(
          'dl',
          { class: 'facts' },
          h('dt', {}, 'Health'),
          h('dd', { 'data-fact': 'health' }, health.status, health.error ? ` (${health.error})` : ''),
          h('dt', {}, 'Version'),
          h('dd', { 'data-fact': 'version' }, platform.version),
          h('dt', {}, 'Backend'),
          h('dd', { 'data-fact': 'backend' }, platform.backend),
          h('dt', {}, 'Database'),
          h('dd', { 'data-fact': 'database' }, platform.database),
        ),
      ),
      h(
        'div',
        { class: 'panel' },
        h('h2', {}, 'Sessions now'),
        h('div', { class: 'stats' }, byStatus.length ? byStatus.map((x) => stat(x.value, x.labels.status)) : h('p', { class: 'empty' }, 'none')),
      ),
      h(
        'div',
        { class: 'panel' },
        h('h2', {}, 'Since this server started'),
        h('div', { class: 'stats' }, m.filter((x) => x.name.endsWith('_total')).map((x) => stat(x.value, x.help || x.name))),
      ),
    );
  };
  main.replaceChildren(h('h1', {}, 'Platform'), box);
  await load();
  page.every(10000, () => load().catch(() => {}));
}

/** Prometheus text → [{name, labels, value, help}]. */
function parseMetrics(text) {
  const help = {};
  const out = [];
  for (const line of text.split('\n')) {
    const hm = /^# HELP (\S+) (.*)$/.exec(line);
    if (hm) help[hm[1]] = hm[2];
    const m = /^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)$/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    out.push({ name: m[1], labels, value: m[3], help: help[m[1]] });
  }
  return out;
}

// ---- sign-in and routing ----

function signInPage(message) {
  csrf = null;
  nav.hidden = true;
  const key = h('input', { type: 'password', name: 'key', autocomplete: 'current-password', required: true });
  const form = h(
    'form',
    { class: 'panel signin', novalidate: true, id: 'sign-in' },
    h('h1', {}, 'Sign in to LAP'),
    h('p', { class: 'muted' }, 'With the master key (MASTER_KEY: lap-server printed it at its first start and keeps it in .lap/master_key).'),
    message ? h('p', { class: 'notice' }, message) : null,
    field('key', 'Master key', key),
    h('p', { class: 'form-error', role: 'alert' }),
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Sign in')),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const s = await api('POST', '/console/session', { key: key.value });
      key.value = '';
      csrf = s.csrf_token;
      start();
    } catch (err) {
      key.value = '';
      showError(form, err);
    }
  });
  main.replaceChildren(form);
  key.focus();
}

let current = null;

function signedOut(message) {
  current?.dispose();
  current = null;
  signInPage(message);
}

const ROUTES = [
  [/^\/agents$/, agentsPage],
  [/^\/agents\/([\w-]+)$/, agentFormPage],
  [/^\/sessions$/, sessionsPage],
  [/^\/sessions\/([\w-]+)$/, sessionPage],
  [/^\/secrets$/, secretsPage],
  [/^\/platform$/, platformPage],
];

async function route() {
  current?.dispose();
  current = null;
  if (!csrf) return;
  const [path, query] = location.hash.replace(/^#/, '').split('?');
  for (const [re, render] of ROUTES) {
    const m = re.exec(path);
    if (!m) continue;
    const section = path.split('/')[1];
    nav.querySelectorAll('a').forEach((a) => a.classList.toggle('current', a.dataset.page === section));
    const page = new Page();
    current = page;
    try {
      await render(page, m[1], new URLSearchParams(query ?? ''));
    } catch (e) {
      if (page.alive && csrf) main.replaceChildren(h('p', { class: 'notice bad' }, e.message));
    }
    return;
  }
  location.hash = '#/sessions';
}

function start() {
  nav.hidden = false;
  if (!ROUTES.some(([re]) => re.test(location.hash.replace(/^#/, '').split('?')[0]))) {
    location.hash = '#/sessions'; // routes through hashchange
    return;
  }
  route();
}

document.getElementById('sign-out').addEventListener('click', async () => {
  await api('DELETE', '/console/session').catch(() => {});
  signedOut('Signed out.');
});
window.addEventListener('hashchange', route);

try {
  csrf = (await api('GET', '/console/session')).csrf_token;
  start();
} catch (e) {
  signInPage(e.status === 401 ? null : e.message);
}
