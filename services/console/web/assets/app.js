// planex console: hash-routed pages over SupervisorService (see connect.js).
// Every value from the API is put into the page as text, never as markup.
import { call, stream, token, setToken, RPCError } from './connect.js';
import { signedIn } from './connect.js';
import * as sso from './sso.js';
import { renderDag, setStatuses, setSelected } from './dag.js';
import { h, enumName, runStatus, stepStatus, words, terminal, badge, time, clockFmt, json, duration, announce, left } from './ui.js';
import { searchForm, searchParams, listRequest, savedViews, batchBar } from './search.js';
import { runTabs, historySection, surgeryButtons, openSurgery, rawTable, rawEventRow, jsonPanel } from './surgery.js';
import { answerForm } from './schema.js';
import { schedulesPage } from './schedules.js';

const main = document.getElementById('main');
const jaegerURL = document.body.dataset.jaegerUrl || '';
let page = null; // the current page's teardown function
let signedOut = false; // the sign-in form is up: no background calls


// ---- authentication -------------------------------------------------------

// A token in the URL fragment (#token=…, as `planex dev` prints it) is kept
// for this tab and removed from the address bar; fragments never reach the
// server or a Referer header.
function tokenFromFragment() {
  const m = location.hash.match(/^#token=([^&]+)(?:&next=(.*))?$/);
  if (!m) return;
  setToken(decodeURIComponent(m[1]));
  history.replaceState(null, '', location.pathname + (m[2] ? decodeURIComponent(m[2]) : '#/runs'));
}

function signIn(message) {
  teardown();
  signedOut = true;
  document.title = 'Sign in · planex console';
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true, 'aria-describedby': 'token-help token-error' });
  const err = h('p', { id: 'token-error', class: 'field-error', role: 'alert' }, message || '');
  const form = h('form', { class: 'panel', onsubmit: (e) => {
    e.preventDefault();
    if (!input.value.trim()) { err.textContent = 'Enter a token.'; input.setAttribute('aria-invalid', 'true'); input.focus(); return; }
    setToken(input.value.trim());
    route();
  } },
  h('div', { class: 'row' }, h('div', { class: 'grow' }, h('label', { for: 'token' }, 'API key or JWT'), input), h('div', {}, h('button', { type: 'submit' }, 'Sign in'))),
  h('p', { id: 'token-help', class: 'muted' }, 'The console forwards this token to the supervisor, which checks it like any API call. It is kept in this tab only (session storage). ',
    'With planex dev, open the URL it prints, or paste the token from its credentials directory (cli.token).'),
  err);
  // Single sign-on, when the console has a provider, comes first: the
  // button sends the browser to the provider and back to this route.
  const next = location.hash.startsWith('#/') ? location.hash : '';
  const ssoBox = h('section', { id: 'sso', class: 'panel', 'aria-label': 'Single sign-on', hidden: true });
  main.replaceChildren(h('h1', {}, 'Sign in'), ssoBox, form);
  input.focus();
  sso.authState(true).then((st) => {
    if (!signedOut || !st.sso || !ssoBox.isConnected) return;
    const button = h('button', { id: 'sso-signin', type: 'button', onclick: () => sso.startSignIn(next) }, `Sign in with ${st.sso.provider}`);
    ssoBox.replaceChildren(button, h('p', { class: 'muted' }, 'Or paste an API key or JWT below.'));
    ssoBox.hidden = false;
    if (document.activeElement === input && !input.value) button.focus();
  });
}

function showError(target, e) {
  if (e instanceof RPCError && e.code === 'unauthenticated') {
    setToken('');
    signIn('The supervisor needs a valid token: ' + e.message);
    return true;
  }
  target.textContent = e instanceof RPCError ? `${words(e.code.replace(/_/g, '-'))}: ${e.message}` : String(e);
  return false;
}

// ---- routing --------------------------------------------------------------

// teardown ends the current page: its polls and streams, and any dialog it
// opened (a link in a dialog leaves the page under it).
function teardown() {
  if (page) { page(); page = null; }
  for (const d of document.querySelectorAll('dialog[open]')) d.close();
}

function parseHash() {
  const [path, query] = location.hash.replace(/^#/, '').split('?');
  return { parts: path.split('/').filter(Boolean), params: new URLSearchParams(query || '') };
}

function route() {
  tokenFromFragment();
  signedOut = false;
  teardown();
  const { parts, params } = parseHash();
  const name = parts[0] || 'runs';
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (a.dataset.nav === name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  document.getElementById('signout').hidden = !signedIn();
  if (name === 'runs' && parts[1]) page = runPage(decodeURIComponent(parts[1]));
  else if (name === 'gates') page = gatesPage(params);
  else if (name === 'tools') page = toolsPage();
  else if (name === 'schedules') page = schedulesPage(main, showError, poll);
  else page = runsPage(params);
}

window.addEventListener('hashchange', () => { if (location.hash.startsWith('#/') || location.hash.startsWith('#token=')) route(); });
document.getElementById('signout').addEventListener('click', async (e) => {
  const button = e.currentTarget;
  setToken('');
  if (sso.ssoSignedIn()) {
    // Ends the console's session, then the provider's (RP-initiated logout).
    const end = await sso.signOut();
    if (end) { location.assign(end); return; }
  }
  button.hidden = true;
  signIn('');
});
document.getElementById('skip').addEventListener('click', (e) => { e.preventDefault(); main.focus(); });

// poll calls fn now and every ms until stopped; fn errors are its own.
function poll(fn, ms) {
  let timer = 0, stopped = false;
  const tick = async () => { await fn(); if (!stopped) timer = setTimeout(tick, ms); };
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}

// keepFocus re-renders with fn and gives focus back to the element with
// the same data-key, so live updates never pull a keyboard user away.
function keepFocus(fn) {
  const key = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : undefined;
  fn();
  if (key) { const e = main.querySelector(`[data-key="${CSS.escape(key)}"]`); if (e) e.focus(); }
}

// Open gates are counted in the header on every page.
async function refreshGateCount() {
  try {
    const gates = await openGates();
    document.getElementById('gate-count').textContent = gates.length ? String(gates.length) : '';
  } catch { /* the page shows errors */ }
}
setInterval(() => { if (!signedOut) refreshGateCount(); }, 5000);

// ---- runs list ------------------------------------------------------------

const defaultPageSize = 20;

function runsPage(params) {
  document.title = 'Runs · planex console';
  const sp = searchParams(params);
  const tokens = (params.get('page') || '').split(',').filter(Boolean); // page tokens so far
  const pageSize = Math.min(500, Math.max(1, Number(params.get('size')) || defaultPageSize));
  const routeOf = (p) => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries({ ...sp, size: params.get('size') || '', page: tokens.join(','), ...p })) if (v) q.set(k, v);
    return '#/runs' + (q.toString() ? '?' + q : '');
  };
  const setParams = (p) => { location.hash = routeOf(p); };
  // "Last hour" and the like are fixed when the first page opens (at=,
  // carried from page to page), so that the API's page tokens stay valid
  // for the same filter.
  const now = (tokens.length && Number(params.get('at'))) || Date.now();
  const listReq = listRequest(sp, now);

  const goal = h('input', { id: 'goal', name: 'goal', required: true, 'aria-describedby': 'goal-error', placeholder: 'How many open support tickets does Acme Corp have?' });
  const goalErr = h('p', { id: 'goal-error', class: 'field-error', role: 'alert' });
  const start = h('form', { class: 'panel', id: 'start-run', onsubmit: async (e) => {
    e.preventDefault();
    goalErr.textContent = '';
    goal.removeAttribute('aria-invalid');
    if (!goal.value.trim()) { goalErr.textContent = 'Enter a goal.'; goal.setAttribute('aria-invalid', 'true'); goal.focus(); return; }
    try {
      const resp = await call('StartRun', { goal: goal.value.trim() });
      location.hash = '#/runs/' + encodeURIComponent(resp.run.id);
    } catch (err) { if (!showError(goalErr, err)) { goal.setAttribute('aria-invalid', 'true'); goal.focus(); } }
  } },
  h('div', { class: 'row' }, h('div', { class: 'grow' }, h('label', { for: 'goal' }, 'Goal'), goal), h('div', {}, h('button', { type: 'submit' }, 'Start run'))),
  goalErr);

  const filters = searchForm(sp, setParams);
  const views = savedViews(routeOf({ page: '', size: '', at: '' }));
  const batch = batchBar(sp, showError);

  const err = h('p', { class: 'error', role: 'alert' });
  const live = h('p', { class: 'live' });
  const tbody = h('tbody', {});
  const table = h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': 'Runs table' }, h('table', { class: 'runs', id: 'runs' },
    h('caption', { class: 'visually-hidden' }, 'Runs, newest first'),
    h('colgroup', {}, h('col', { class: 'id' }), h('col', {}), h('col', { class: 'status' }), h('col', { class: 'steps' }), h('col', { class: 'time' }), h('col', { class: 'time' })),
    h('thead', {}, h('tr', {}, ['Run', 'Goal', 'Status', 'Steps', 'Created', 'Updated'].map((t) => h('th', { scope: 'col' }, t)))),
    tbody));
  const prev = h('button', { type: 'button', class: 'secondary', disabled: tokens.length === 0, onclick: () => setParams({ page: tokens.slice(0, -1).join(','), at: String(now) }) }, 'Previous page');
  const next = h('button', { type: 'button', class: 'secondary', disabled: true });
  next.textContent = 'Next page';
  const pageNo = h('span', { class: 'muted' }, `Page ${tokens.length + 1}`);
  main.replaceChildren(h('h1', {}, 'Runs'), start, filters, views, batch, err, live, table, h('nav', { class: 'pager', 'aria-label': 'Pages' }, prev, pageNo, next));

  let nextToken = '';
  next.addEventListener('click', () => setParams({ page: [...tokens, nextToken].join(','), at: String(now) }));
  let last = '';
  const stop = poll(async () => {
    // The basic view: the page from the supervisor's run index, no run read.
    const req = { ...listReq, view: 'RUN_VIEW_BASIC', pageSize, pageToken: tokens[tokens.length - 1] || '' };
    try {
      const resp = await call('ListRuns', req);
      err.textContent = '';
      live.textContent = 'Live · updated ' + clockFmt.format(new Date());
      nextToken = resp.nextPageToken || '';
      next.disabled = !nextToken;
      const runs = resp.runs || [];
      const sig = JSON.stringify(runs.map((r) => [r.id, r.status, r.updatedAt]));
      if (sig === last) return;
      last = sig;
      keepFocus(() => tbody.replaceChildren(...(runs.length ? runs.map(runRow) : [h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No runs match.'))])));
    } catch (e) { showError(err, e); }
  }, 2000);
  refreshGateCount();
  return stop;
}

function runRow(r) {
  // A basic view counts its steps; a server before views sends them whole.
  const steps = r.steps || [];
  const counts = r.stepCounts || { total: steps.length, succeeded: steps.filter((s) => s.status === 'STEP_STATUS_SUCCEEDED').length };
  const done = counts.succeeded || 0;
  return h('tr', { dataset: { runId: r.id } },
    h('td', { class: 'mono' }, h('a', { href: '#/runs/' + encodeURIComponent(r.id), dataset: { key: 'run-' + r.id } }, r.id.slice(-10))),
    h('td', {}, r.goal),
    h('td', {}, badge(runStatus(r))),
    h('td', {}, `${done}/${counts.total || 0}`),
    h('td', {}, time(r.createdAt)),
    h('td', {}, time(r.updatedAt)));
}

// ---- run detail -----------------------------------------------------------

const eventKinds = {
  created: 'Run created', planRevised: 'Plan revised', planRejected: 'Plan rejected', stepDispatched: 'Step dispatched',
  stepStarted: 'Step started', stepSucceeded: 'Step succeeded', stepFailed: 'Step failed', expectationFailed: 'Expectation failed',
  replanRequested: 'Replan requested', gateOpened: 'Gate opened', gateDecided: 'Gate decided', budgetUsed: 'Budget used',
  finished: 'Run finished', stepRetrying: 'Step retrying', runReset: 'Run reset', runForked: 'Run forked',
};

function describe(kind, p) {
  switch (kind) {
    case 'created': return p.goal;
    case 'planRevised': return `revision ${p.plan.revision || 1}: ${(p.plan.steps || []).length} steps${p.backend ? ' (' + p.backend + ')' : ''}`;
    case 'planRejected': return `revision ${p.revision || 0}: ${(p.errors || []).join('; ')}`;
    case 'stepDispatched': return `${p.stepId} → ${p.tool} (attempt ${p.attempt || 1})`;
    case 'stepStarted': return `${p.stepId} on ${p.executorId || '?'} (attempt ${p.attempt || 1})`;
    case 'stepSucceeded': return `${p.stepId} in ${duration(p.duration)}`;
    case 'stepFailed': return `${p.stepId}: ${(p.error || {}).code || ''} ${(p.error || {}).message || ''}`;
    case 'expectationFailed': return `${p.stepId}: ${p.message || p.expect}`;
    case 'replanRequested': return `${p.stepId || ''} ${p.reason || ''}`;
    case 'stepRetrying': return `${p.stepId}: retry ${p.retry} after ${(p.error || {}).message || 'an error'}`;
    case 'gateOpened': return `${p.gate.id}${p.gate.stepId ? ' (step ' + p.gate.stepId + ')' : ''}: ${p.gate.reason || ''}`;
    case 'gateDecided': return `${p.gateId}: ${p.answer !== undefined ? 'answered ' + JSON.stringify(p.answer) : enumName(p.decision, 'DECISION_KIND_')}${p.stopRun ? ', stop the run' : ''}${p.comment ? ' — ' + p.comment : ''}${p.actor ? ' by ' + p.actor : ''}`;
    case 'budgetUsed': return describeBudget(p.usage || {});
    case 'finished': return `${enumName(p.status, 'RUN_STATUS_')}${p.message ? ': ' + p.message : ''}`;
    case 'runReset': return `${p.fromStep ? 'from ' + p.fromStep : p.toSequence && p.toSequence !== '0' ? 'to event #' + p.toSequence : 'from the steps that did not succeed'}${p.replan ? ', replan' : ''} by ${p.resetBy || p.actor || '?'}: ${p.reason || ''}`;
    case 'runForked': return `fork ${p.forkRunId} at event #${p.atSequence || '?'} by ${p.forkedBy || '?'}${p.reason ? ': ' + p.reason : ''}`;
    default: return '';
  }
}

// describeBudget tells the two budget events of a planner call apart: the
// reservation before the call (tokensReserved set) and the settlement
// after it, which would otherwise read the same when the call spent no
// tokens (the playbook planner).
function describeBudget(u) {
  const used = `steps ${u.steps || 0}, replans ${u.replans || 0}, tokens ${u.tokens || 0}`;
  if (Number(u.tokensReserved || 0) > 0) return `planner call: ${u.tokensReserved} tokens reserved; used so far: ${used}`;
  return `planner call settled; used: ${used}`;
}

function eventItem(ev) {
  const kind = Object.keys(eventKinds).find((k) => ev[k]) || 'event';
  return h('li', { dataset: { seq: ev.sequence, kind } },
    h('span', { class: 'mono muted' }, '#' + ev.sequence),
    h('span', { class: 'time' }, time(ev.time, clockFmt)),
    h('span', { class: 'kind' }, eventKinds[kind] || kind),
    h('span', { class: 'what' }, describe(kind, ev[kind] || {})));
}

// stateOf returns the step state shown for step id in revision rev: the
// state recorded in that revision or kept from an earlier one.
function stateOf(run, rev, id) {
  const plan = (run.plans || []).find((p) => (p.revision || 1) === rev) || {};
  const l = plan.lineage || {};
  // A step added or changed by this revision has no state before it.
  const fresh = l.previousRevision && ((l.added || []).includes(id) || (l.changed || []).includes(id));
  let best = null;
  for (const s of run.steps || []) {
    if (s.stepId !== id || (s.planRevision || 1) > rev || (fresh && (s.planRevision || 1) !== rev)) continue;
    if (!best || (s.planRevision || 1) >= (best.planRevision || 1)) best = s;
  }
  return best;
}

function runPage(id) {
  document.title = `Run ${id} · planex console`;
  const ctl = new AbortController();
  const err = h('p', { class: 'error', role: 'alert' });
  const title = h('h1', {}, 'Run ', h('span', { class: 'mono' }, id));
  const status = h('span', { id: 'run-status' });
  const meta = h('dl', { class: 'meta', id: 'run-meta' });
  const actions = h('div', { class: 'row actions' });
  const result = h('div', { id: 'run-result' });
  const budget = h('div', { id: 'run-budget' });
  const plans = h('div', { id: 'plans' });
  const stepsBody = h('tbody', {});
  const timeline = h('ol', { class: 'timeline', id: 'timeline', tabindex: '0', 'aria-label': 'Event timeline, oldest first' });
  const streamState = h('p', { class: 'live', id: 'stream-state' });
  const history = historySection();
  const raw = rawTable();
  const jsonP = jsonPanel();
  const events = []; // every event seen, in log order
  const overview = h('div', {},
    h('div', { class: 'grid2' }, h('section', { 'aria-labelledby': 'h-meta' }, h('h2', { id: 'h-meta' }, 'Details'), meta),
      h('section', { 'aria-labelledby': 'h-budget' }, h('h2', { id: 'h-budget' }, 'Budget used'), budget)),
    h('section', { 'aria-labelledby': 'h-history' }, h('h2', { id: 'h-history' }, 'Resets and forks'), history.el),
    h('section', { 'aria-labelledby': 'h-plan' }, h('h2', { id: 'h-plan' }, 'Plan'),
      h('div', { class: 'legend', 'aria-label': 'Step status colours' }, ['pending', 'waiting-approval', 'dispatched', 'running', 'succeeded', 'failed', 'skipped', 'outcome-unknown', 'superseded'].map((s) => badge(s))),
      plans),
    h('section', { 'aria-labelledby': 'h-steps' }, h('h2', { id: 'h-steps' }, 'Steps'),
      h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': 'Steps table' }, h('table', { class: 'steps', id: 'steps' },
        h('caption', { class: 'visually-hidden' }, 'Steps of every revision'),
        h('thead', {}, h('tr', {}, ['Step', 'Tool', 'Revision', 'Status', 'Attempt', 'Retries', 'Duration'].map((t) => h('th', { scope: 'col' }, t)))),
        stepsBody))),
    h('section', { 'aria-labelledby': 'h-events' }, h('h2', { id: 'h-events' }, 'Events'), streamState, timeline),
    // Last, so that a result arriving never pushes the rest of the page.
    h('section', { 'aria-labelledby': 'h-result' }, h('h2', { id: 'h-result' }, 'Result'), result));
  const tabs = runTabs([
    { id: 'overview', label: 'Overview', el: overview },
    { id: 'raw', label: 'Raw events', el: h('div', {}, h('p', { class: 'muted' }, 'The run log as stored: every event with its sequence, time, hash chain and payload, from WatchRun.'), raw.el) },
    { id: 'json', label: 'JSON', el: jsonP.el }]);
  main.replaceChildren(
    h('p', {}, h('a', { href: '#/runs' }, '← All runs')),
    title, status, err, actions, tabs.el);

  let run = null;
  let drawnRevisions = -1;
  const openSteps = new Set();
  let selected = ''; // the step chosen in the DAG or the steps table
  const surgery = (kind, stepId) => openSurgery(kind, run, stepId, { showError: (t, e) => showError(t, e), done: (k, resp) => {
    if (k === 'fork' && resp.run) location.hash = '#/runs/' + encodeURIComponent(resp.run.id);
    else { announce('Run reset'); route(); }
  } });
  const selectStep = (stepId) => {
    openSteps.add(stepId);
    selected = stepId;
    render();
    const row = document.getElementById('step-' + stepId);
    if (row) { row.scrollIntoView({ block: 'center' }); row.querySelector('summary').focus(); }
  };

  function render() {
    const rs = runStatus(run);
    status.replaceChildren(badge(rs));
    title.replaceChildren(run.goal);
    const trace = run.traceId ? (jaegerURL ? h('a', { href: `${jaegerURL.replace(/\/$/, '')}/trace/${run.traceId}`, target: '_blank', rel: 'noopener', id: 'trace-link' }, 'Open trace in Jaeger ', h('span', { class: 'mono' }, run.traceId)) : h('span', { class: 'mono' }, run.traceId)) : '—';
    const rows = [['Run', h('span', { class: 'mono' }, run.id)], ['Status', words(rs)],
      ['Stop reason', run.stopReason ? words(enumName(run.stopReason, 'STOP_REASON_')) + (run.stopMessage ? ': ' + run.stopMessage : '') : '—'],
      ['Created', time(run.createdAt)], ['Updated', time(run.updatedAt)], ['Finished', time(run.finishedAt)],
      ['Started by', run.startedBy || '—'], ['Mode', words(enumName(run.mode, 'PLANNING_MODE_')) || 'full'],
      ['Labels', Object.entries(run.labels || {}).map(([k, v]) => `${k}=${v}`).join(', ') || '—'], ['Trace', trace]];
    if (run.resets) rows.push(['Resets', h('span', {}, `${run.resets}, last `, time(run.resetAt))]);
    if (run.forkedFrom && run.forkedFrom.runId) rows.push(['Forked from', h('a', { href: '#/runs/' + encodeURIComponent(run.forkedFrom.runId), class: 'mono' }, run.forkedFrom.runId)]);
    meta.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));

    const b = run.budget || {}, u = run.usage || {};
    budget.replaceChildren(h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': 'Budget table' }, h('table', {}, h('caption', { class: 'visually-hidden' }, 'Budget used and limits'),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Budget'), h('th', { scope: 'col' }, 'Used'), h('th', { scope: 'col' }, 'Limit'))),
      h('tbody', {},
        h('tr', {}, h('th', { scope: 'row' }, 'Step attempts'), h('td', {}, String(u.steps || 0)), h('td', {}, String(b.maxSteps || '—'))),
        h('tr', {}, h('th', { scope: 'row' }, 'Replans'), h('td', {}, String(u.replans || 0)), h('td', {}, String(b.maxReplans ?? '—'))),
        h('tr', {}, h('th', { scope: 'row' }, 'Tokens'), h('td', {}, String(u.tokens || 0)), h('td', {}, String(b.maxTokens || '—'))),
        h('tr', {}, h('th', { scope: 'row' }, 'Deadline'), h('td', {}, '—'), h('td', {}, duration(b.deadline)))))));

    const open = (run.gates || []).filter((g) => !g.decision);
    actions.replaceChildren(
      open.length ? h('a', { href: '#/gates?run=' + encodeURIComponent(run.id), id: 'decide-link' }, `Decide ${open.length} open gate${open.length > 1 ? 's' : ''}`) : '',
      terminal.has(rs) ? '' : h('button', { type: 'button', class: 'danger', id: 'cancel', onclick: async () => {
        if (!confirm('Cancel this run? Steps in flight finish; nothing new starts.')) return;
        try { run = (await call('CancelRun', { runId: run.id, reason: 'cancelled from the console' })).run; render(); } catch (e) { showError(err, e); }
      } }, 'Cancel run'),
      ...surgeryButtons(run, terminal.has(rs), selected, surgery),
      selected ? h('button', { type: 'button', class: 'link', id: 'unselect', onclick: () => { selected = ''; render(); } }, `Unselect ${selected}`) : '');
    history.update(run, events);
    jsonP.update(run);

    if (run.result !== undefined) result.replaceChildren(json(run.result));
    else if (terminal.has(rs)) result.replaceChildren(h('p', {}, run.stopMessage || 'No result.'));
    else result.replaceChildren(h('p', { class: 'muted' }, 'Not finished yet.'));

    const revs = run.plans || [];
    const statusIn = (rev) => (sid) => { const s = stateOf(run, rev, sid); return s ? stepStatus(s) : 'superseded'; };
    if (revs.length !== drawnRevisions) {
      drawnRevisions = revs.length;
      const sections = revs.map((p, i) => {
        const rev = p.revision || i + 1;
        const l = p.lineage || {};
        const lin = (sid) => (!l.previousRevision ? '' : (l.added || []).includes(sid) ? 'added' : (l.changed || []).includes(sid) ? 'changed' : '');
        const current = i === revs.length - 1;
        const lineage = l.previousRevision ? h('p', { class: 'muted' }, `Replan of revision ${l.previousRevision}: kept ${(l.kept || []).join(', ') || 'none'}; added ${(l.added || []).join(', ') || 'none'}; changed ${(l.changed || []).join(', ') || 'none'}; dropped ${(l.dropped || []).join(', ') || 'none'}. Dashed outlines are added or changed steps.`) : '';
        const body = [p.rationale ? h('p', {}, p.rationale) : '', lineage,
          h('div', { class: 'dag-wrap', tabindex: '0', role: 'region', 'aria-label': `Plan revision ${rev} graph` }, renderDag(p, statusIn(rev), lin, selectStep))];
        const heading = `Revision ${rev}${current ? ' (current)' : ''}`;
        return current
          ? h('section', { class: 'revision', dataset: { revision: rev, current: '1' } }, h('h3', {}, heading), body)
          : h('details', { class: 'revision', dataset: { revision: rev } }, h('summary', {}, heading), body);
      });
      plans.replaceChildren(...(sections.length ? sections : [h('p', { class: 'muted' }, 'Planning…')]));
    } else {
      for (const sec of plans.querySelectorAll('.revision')) setStatuses(sec.querySelector('svg'), statusIn(Number(sec.dataset.revision)));
    }
    const curSvg = plans.querySelector('[data-current] svg');
    if (curSvg) setSelected(curSvg, selected);

    // One row per step of the current plan, in plan order, from the start
    // (rows do not appear as steps are dispatched), then steps of earlier
    // revisions that the current one dropped or changed.
    const curPlan = revs.length ? revs[revs.length - 1] : { steps: [] };
    const curRev = curPlan.revision || revs.length;
    const rowsOf = (curPlan.steps || []).map((p) => stateOf(run, curRev, p.id) || { stepId: p.id, tool: p.tool, planRevision: curRev, status: 'STEP_STATUS_PENDING' });
    const shown = new Set(rowsOf);
    for (const s of run.steps || []) if (!shown.has(s)) rowsOf.push(s);
    const here = { finished: terminal.has(rs), current: shown, open: surgery, select: (sid) => { selected = sid; render(); } };
    keepFocus(() => stepsBody.replaceChildren(...rowsOf.map((s) => stepRows(run, s, openSteps, here))));
  }

  const load = async () => {
    try { run = (await call('GetRun', { runId: id }, ctl.signal)).run; err.textContent = ''; render(); } catch (e) { if (e.name !== 'AbortError') showError(err, e); }
  };
  let pending = 0;
  const refresh = () => { if (!pending) pending = setTimeout(() => { pending = 0; load(); }, 150); };

  // Follow the run: WatchRun from the first event (or after the last one
  // seen when the stream broke), refreshing the run on each event.
  (async () => {
    await load();
    let from = 1;
    for (let tries = 0; !ctl.signal.aborted; tries++) {
      try {
        streamState.textContent = 'Live: following events…';
        for await (const msg of stream('WatchRun', { runId: id, fromSequence: String(from) }, ctl.signal)) {
          const ev = msg.event;
          from = Number(ev.sequence) + 1;
          const atBottom = timeline.scrollTop + timeline.clientHeight >= timeline.scrollHeight - 4;
          events.push(ev);
          raw.body.append(rawEventRow(ev));
          timeline.append(eventItem(ev));
          if (atBottom) timeline.scrollTop = timeline.scrollHeight;
          if (ev.finished) announce('Run ' + words(enumName(ev.finished.status, 'RUN_STATUS_')));
          refresh();
        }
        streamState.textContent = 'The run finished; all events shown.';
        await load();
        return;
      } catch (e) {
        if (e.name === 'AbortError' || ctl.signal.aborted) return;
        if (e instanceof RPCError && ['unauthenticated', 'permission_denied', 'not_found', 'invalid_argument'].includes(e.code)) { showError(err, e); return; }
        streamState.textContent = `Event stream interrupted (${e.message}); reconnecting…`;
        await new Promise((r) => setTimeout(r, Math.min(5000, 500 * (tries + 1))));
      }
    }
  })();
  return () => { ctl.abort(); clearTimeout(pending); };
}

function stepRows(run, s, openSteps, here) {
  const st = stepStatus(s);
  const plan = (run.plans || []).find((p) => (p.revision || 1) === (s.planRevision || 1)) || {};
  const spec = (plan.steps || []).find((p) => p.id === s.stepId) || {};
  const details = h('details', { id: 'step-' + s.stepId + (s.planRevision > 1 ? '' : ''), open: openSteps.has(s.stepId),
    ontoggle: (e) => { if (e.target.open) openSteps.add(s.stepId); else openSteps.delete(s.stepId); } },
  h('summary', { dataset: { key: `step-${s.stepId}-${s.planRevision || 1}` } }, h('span', { class: 'mono' }, s.stepId)),
  spec.description ? h('p', {}, spec.description) : '',
  h('h3', {}, 'Arguments'), json(s.resolvedArgs || spec.args || {}),
  s.output !== undefined ? [h('h3', {}, 'Output' + (s.outputTruncated ? ' (truncated)' : '')), json(s.output)] : '',
  s.outputRef ? h('p', {}, `Output kept in the object store: ${s.outputRef.bucket}/${s.outputRef.name} (${s.outputRef.size} bytes)`) : '',
  s.error ? [h('h3', {}, 'Error'), h('p', { class: 'error' }, `${enumName(s.error.code, 'ERROR_CODE_')}: ${s.error.message || ''}${s.error.field ? ' (field ' + s.error.field + ')' : ''}`)] : '',
  s.retryAt ? h('p', {}, 'Next attempt at ', time(s.retryAt)) : '',
  h('p', { class: 'muted' }, 'Dispatched ', time(s.dispatchedAt), ' · started ', time(s.startedAt), ' · finished ', time(s.finishedAt), s.executorId ? ' · executor ' + s.executorId : ''),
  here && here.current.has(s)
    ? h('div', { class: 'row actions' },
      here.finished ? h('button', { type: 'button', class: 'danger reset-here', dataset: { key: `reset-${s.stepId}` }, onclick: () => { here.select(s.stepId); here.open('reset', s.stepId); } }, 'Reset from here') : '',
      h('button', { type: 'button', class: 'secondary fork-here', dataset: { key: `fork-${s.stepId}` }, onclick: () => { here.select(s.stepId); here.open('fork', s.stepId); } }, 'Fork from here'))
    : '');
  return h('tr', { dataset: { stepId: s.stepId, status: st } },
    h('td', {}, details), h('td', { class: 'mono' }, s.tool), h('td', {}, String(s.planRevision || 1)),
    h('td', {}, badge(st)), h('td', {}, String(s.attempt || 0)), h('td', {}, String(s.retries || 0)), h('td', {}, duration(s.duration)));
}

// ---- gates ----------------------------------------------------------------

// openGates lists every open gate of every waiting run.
async function openGates(runFilter) {
  const gates = [];
  let pageToken = '';
  do {
    const resp = await call('ListRuns', { statuses: ['RUN_STATUS_WAITING'], pageSize: 200, pageToken });
    for (const run of resp.runs || []) {
      if (runFilter && run.id !== runFilter) continue;
      for (const g of run.gates || []) if (!g.decision) gates.push({ run, gate: g });
    }
    pageToken = resp.nextPageToken || '';
  } while (pageToken);
  return gates;
}

function gatesPage(params) {
  document.title = 'Gates · planex console';
  const runFilter = params.get('run') || '';
  const err = h('p', { class: 'error', role: 'alert' });
  const live = h('p', { class: 'live' });
  const list = h('div', { id: 'gates' });
  const bulkReason = h('input', { id: 'bulk-reason', 'aria-describedby': 'bulk-error' });
  const bulkErr = h('p', { id: 'bulk-error', class: 'field-error', role: 'alert' });
  const bulkStop = h('input', { type: 'checkbox', id: 'bulk-stop' });
  const selected = () => [...list.querySelectorAll('input.pick:checked')].map((c) => cards.get(c.value)).filter(Boolean);
  const bulk = h('form', { class: 'panel bulk', 'aria-label': 'Decide the selected gates', onsubmit: (e) => e.preventDefault() },
    h('div', { class: 'row' },
      h('div', { class: 'grow' }, h('label', { for: 'bulk-reason' }, 'Reason for the selected gates (required to reject)'), bulkReason),
      h('div', {}, h('button', { type: 'button', id: 'approve-selected', onclick: () => decideMany('DECISION_KIND_APPROVE') }, 'Approve selected')),
      h('div', {}, h('button', { type: 'button', class: 'danger', id: 'reject-selected', onclick: () => decideMany('DECISION_KIND_REJECT') }, 'Reject selected'))),
    h('p', { class: 'check' }, bulkStop, h('label', { for: 'bulk-stop' }, 'Stop the runs when rejecting (otherwise each goes back to its planner with the reason)')),
    bulkErr);
  main.replaceChildren(h('h1', {}, 'Open gates'), runFilter ? h('p', {}, 'Gates of run ', h('span', { class: 'mono' }, runFilter), ' · ', h('a', { href: '#/gates' }, 'all runs')) : '',
    bulk, err, live, list);

  const cards = new Map(); // key run/gate → card
  async function decideMany(decision) {
    bulkErr.textContent = '';
    bulkReason.removeAttribute('aria-invalid');
    const picked = selected();
    if (!picked.length) { bulkErr.textContent = 'Select at least one gate.'; return; }
    if (decision === 'DECISION_KIND_REJECT' && !bulkReason.value.trim()) {
      bulkErr.textContent = 'Give a reason to reject.'; bulkReason.setAttribute('aria-invalid', 'true'); bulkReason.focus(); return;
    }
    // One Decide per gate, concurrently; each card shows its own outcome.
    const stopRun = decision === 'DECISION_KIND_REJECT' && bulkStop.checked;
    const results = await Promise.all(picked.map((c) => c.decide(decision, bulkReason.value.trim(), undefined, stopRun)));
    const ok = results.filter(Boolean).length;
    announce(`${ok} of ${picked.length} gates decided`);
    bulkErr.textContent = ok === picked.length ? '' : `${picked.length - ok} of ${picked.length} decisions failed; see each gate.`;
  }

  const stop = poll(async () => {
    try {
      const gates = await openGates(runFilter);
      err.textContent = '';
      live.textContent = `Live · ${gates.length} open gate${gates.length === 1 ? '' : 's'} · updated ${clockFmt.format(new Date())}`;
      document.getElementById('gate-count').textContent = gates.length ? String(gates.length) : '';
      const keys = new Set();
      for (const { run, gate } of gates) {
        const key = run.id + '/' + gate.id;
        keys.add(key);
        if (!cards.has(key)) { const c = gateCard(run, gate); cards.set(key, c); list.append(c.el); }
      }
      // Gates decided elsewhere leave once their card is not in use (focus
      // inside); those decided here stay, with their outcome, until the
      // page is left.
      for (const [key, c] of cards) {
        if (!keys.has(key) && !c.el.dataset.decided && !c.el.contains(document.activeElement) && !c.busy) { c.el.remove(); cards.delete(key); }
      }
      if (!cards.size && !list.querySelector('.empty')) list.append(h('p', { class: 'muted empty' }, 'No open gates.'));
      if (cards.size) list.querySelector('.empty')?.remove();
    } catch (e) { showError(err, e); }
  }, 2000);
  const clock = setInterval(tickSLAs, 1000);
  return () => { stop(); clearInterval(clock); };
}

function gateCard(run, gate) {
  const key = `${run.id}-${gate.id}`.replace(/[^A-Za-z0-9_-]/g, '_');
  const step = (run.steps || []).find((s) => s.stepId === gate.stepId && (s.planRevision || 1) === (gate.planRevision || 1));
  const plan = (run.plans || []).find((p) => (p.revision || 1) === (gate.planRevision || 1)) || {};
  const spec = (plan.steps || []).find((p) => p.id === gate.stepId) || {};
  const args = (step && step.resolvedArgs) || spec.args || {};
  const pick = h('input', { type: 'checkbox', class: 'pick', id: 'pick-' + key, value: run.id + '/' + gate.id });
  const reason = h('input', { id: 'reason-' + key, 'aria-describedby': 'reason-error-' + key, dataset: { key: 'reason-' + key } });
  const reasonErr = h('p', { id: 'reason-error-' + key, class: 'field-error', role: 'alert' });
  const stopRun = h('input', { type: 'checkbox', class: 'stop-run', id: 'stop-' + key });
  const argsIn = h('textarea', { id: 'args-' + key, spellcheck: 'false', 'aria-describedby': 'args-error-' + key, rows: 6 });
  argsIn.value = JSON.stringify(args, null, 2);
  const argsErr = h('p', { id: 'args-error-' + key, class: 'field-error', role: 'alert' });
  const result = h('p', { class: 'result', role: 'status' });
  // An input gate (a human.input step) asks a question: its card is a form
  // generated from the answer's schema (schema.js), or JSON typed as is.
  const input = gate.kind === 'GATE_KIND_INPUT' ? gate.input || {} : null;
  const form = input ? answerForm(input.schema, 'answer-' + key) : null;
  const answerJSON = h('textarea', { id: 'answer-json-' + key, class: 'answer-json', spellcheck: 'false', rows: 3, 'aria-describedby': 'answer-error-' + key });
  const answerErr = h('p', { id: 'answer-error-' + key, class: 'field-error answer-error', role: 'alert' });
  const buttons = [];
  const card = { el: null, busy: false };
  card.decide = async (decision, comment, editedArgs, stop, answer) => {
    for (const e of [reason, argsIn, answerJSON]) e.removeAttribute('aria-invalid');
    reasonErr.textContent = argsErr.textContent = answerErr.textContent = '';
    card.busy = true;
    buttons.forEach((b) => { b.disabled = true; });
    result.textContent = 'Sending…';
    try {
      const req = { runId: run.id, gateId: gate.id, decision, actor: 'console', comment };
      if (editedArgs) req.editedArgs = editedArgs;
      if (stop) req.stopRun = true;
      if (answer !== undefined) req.answer = answer;
      const resp = await call('Decide', req);
      let verdict = { DECISION_KIND_APPROVE: answer !== undefined ? 'Answered' : 'Approved', DECISION_KIND_REJECT: 'Rejected', DECISION_KIND_EDIT: 'Approved with edited arguments' }[decision];
      if (decision === 'DECISION_KIND_REJECT') {
        verdict += resp.run.stopReason === 'STOP_REASON_REJECTED' ? ' and the run stopped' : ' and sent back to the planner with the reason';
      }
      result.replaceChildren(`${verdict}. Run is now ${words(runStatus(resp.run))}. `, h('a', { href: '#/runs/' + encodeURIComponent(run.id) }, 'Open the run'));
      pick.checked = false;
      pick.disabled = true;
      card.el.dataset.decided = decision;
      return true;
    } catch (e) {
      buttons.forEach((b) => { b.disabled = false; });
      result.textContent = '';
      if (input && e instanceof RPCError && e.code === 'invalid_argument' && /^(decisions\[\d+\]\.)?answer/.test(e.message)) {
        // The schema refused the answer: the gate stays open.
        answerErr.textContent = e.message; answerJSON.setAttribute('aria-invalid', 'true');
        if (answerJSON.value.trim()) answerJSON.focus(); else form.focus();
      } else if (e instanceof RPCError && e.code === 'invalid_argument' && /edited_args/.test(e.message)) {
        argsErr.textContent = e.message; argsIn.setAttribute('aria-invalid', 'true'); argsIn.focus();
      } else if (e instanceof RPCError && e.code === 'invalid_argument' && /comment/.test(e.message)) {
        reasonErr.textContent = e.message; reason.setAttribute('aria-invalid', 'true'); reason.focus();
      } else if (!showError(result, e)) result.classList.add('error');
      return false;
    } finally { card.busy = false; }
  };
  const approve = h('button', { type: 'button', class: 'approve', onclick: () => card.decide('DECISION_KIND_APPROVE', reason.value.trim()) }, 'Approve');
  const reject = h('button', { type: 'button', class: 'danger reject', onclick: () => {
    if (!reason.value.trim()) { reasonErr.textContent = 'Give a reason to reject.'; reason.setAttribute('aria-invalid', 'true'); reason.focus(); return; }
    card.decide('DECISION_KIND_REJECT', reason.value.trim(), undefined, stopRun.checked);
  } }, 'Reject');
  const edit = h('button', { type: 'button', class: 'secondary edit', onclick: () => {
    let v;
    try { v = JSON.parse(argsIn.value); } catch (e) { argsErr.textContent = 'Arguments: not valid JSON (' + e.message + ').'; argsIn.setAttribute('aria-invalid', 'true'); argsIn.focus(); return; }
    if (v === null || typeof v !== 'object' || Array.isArray(v)) { argsErr.textContent = 'Arguments: want a JSON object.'; argsIn.setAttribute('aria-invalid', 'true'); argsIn.focus(); return; }
    card.decide('DECISION_KIND_EDIT', reason.value.trim(), v);
  } }, 'Approve with edited arguments');
  const answerBtn = h('button', { type: 'button', class: 'approve answer', onclick: () => {
    let v;
    try {
      v = answerJSON.value.trim() ? JSON.parse(answerJSON.value) : form.value();
    } catch (e) {
      answerErr.textContent = answerJSON.value.trim() ? 'Answer: not valid JSON (' + e.message + ').' : e.message;
      answerJSON.setAttribute('aria-invalid', 'true');
      return;
    }
    card.decide('DECISION_KIND_APPROVE', reason.value.trim(), undefined, false, v);
  } }, 'Answer');
  buttons.push(approve, reject, edit, answerBtn);
  const title = input ? `Step ${gate.stepId} asks` : gate.stepId ? `Step ${gate.stepId} (${spec.tool || step?.tool || '?'})` : `Plan revision ${gate.planRevision || 1}`;
  card.el = h('article', { class: 'gate', dataset: { runId: run.id, gateId: gate.id }, 'aria-labelledby': 'gate-title-' + key },
    // An input gate is not among the gates bulk actions decide: its
    // question needs its own answer, which approving without one lacks.
    h('header', {}, input ? '' : pick, h('h2', { id: 'gate-title-' + key }, input ? title : h('label', { for: 'pick-' + key }, title)),
      h('span', { class: 'muted' }, 'opened ', time(gate.openedAt))),
    h('p', {}, h('a', { href: '#/runs/' + encodeURIComponent(run.id) }, run.goal), ' · ', h('span', { class: 'mono' }, run.id)),
    input ? h('p', { class: 'question' }, input.question || '') : gate.reason ? h('p', {}, 'Why: ', gate.reason) : '',
    spec.description ? h('p', { class: 'muted' }, spec.description) : '',
    gateFacts(gate),
    input ? [form.el, h('details', {}, h('summary', {}, 'Answer as JSON instead'), h('label', { for: 'answer-json-' + key }, 'Answer (JSON)'), answerJSON), answerErr] : '',
    gate.stepId && !input ? h('div', { class: 'gate-args' }, h('h3', {}, 'Arguments'), argsView(args)) : '',
    h('div', { class: 'row' }, h('div', { class: 'grow' }, h('label', { for: 'reason-' + key }, 'Reason or comment'), reason)),
    reasonErr,
    gate.stepId && !input ? h('details', {}, h('summary', {}, 'Edit the arguments to approve with changes'), h('label', { for: 'args-' + key }, 'Arguments (JSON)'), argsIn, argsErr) : '',
    gate.stopOnReject ? h('p', { class: 'muted' }, 'Rejecting stops the run: the rule that opened this gate says on_reject: stop.')
      : h('p', { class: 'check' }, stopRun, h('label', { for: 'stop-' + key }, 'Stop the run when rejecting (otherwise the planner gets the reason and plans again)')),
    h('div', { class: 'actions' }, input ? answerBtn : approve, reject, gate.stepId && !input ? edit : ''),
    result);
  return card;
}

// gateFacts are a gate's policy rule, approvers and SLA with the time
// left (kept current by the gates page's clock).
function gateFacts(gate) {
  const rows = [];
  if (gate.policy || gate.rule) rows.push(['Policy rule', h('span', { class: 'mono gate-rule' }, [gate.policy, gate.rule].filter(Boolean).join(' · '))]);
  rows.push(['Approvers', (gate.approvers || []).length ? h('span', { class: 'gate-approvers' }, gate.approvers.join(', ')) : h('span', { class: 'muted gate-approvers' }, 'anyone allowed to decide gates')]);
  if (gate.slaAt) {
    const then = gate.onTimeout === 'GATE_TIMEOUT_ACTION_REJECT' ? 'then rejected' : 'then the run is escalated';
    rows.push(['SLA', h('span', {}, time(gate.slaAt), ' · ', h('strong', { class: 'sla-left', dataset: { sla: gate.slaAt } }, left(gate.slaAt)), ' · ', then)]);
  } else rows.push(['SLA', h('span', { class: 'muted' }, 'none')]);
  return h('dl', { class: 'meta gate-facts' }, rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

// argsView shows arguments as they would run: SQL and other long text as
// code, the rest as JSON.
function argsView(args) {
  const entries = Object.entries(args || {});
  if (!entries.length) return h('p', { class: 'muted' }, 'No arguments.');
  return h('dl', { class: 'args' }, entries.flatMap(([k, v]) => {
    const code = typeof v === 'string' && (/sql|query|script|command/i.test(k) || v.includes('\n'));
    const val = code ? h('pre', { tabindex: '0' }, h('code', { class: /sql|query/i.test(k) ? 'language-sql' : '' }, v))
      : typeof v === 'string' ? h('span', { class: 'mono' }, v)
        : JSON.stringify(v).length <= 60 ? h('span', { class: 'mono' }, JSON.stringify(v)) : h('pre', { tabindex: '0' }, JSON.stringify(v, null, 2));
    return [h('dt', { class: 'mono' }, k), h('dd', { dataset: { arg: k } }, val)];
  }));
}

// tickSLAs updates every SLA countdown on the page.
function tickSLAs() {
  const now = Date.now();
  for (const e of main.querySelectorAll('.sla-left[data-sla]')) {
    e.textContent = left(e.dataset.sla, now);
    e.classList.toggle('overdue', new Date(e.dataset.sla).getTime() < now);
  }
}

// ---- tools ----------------------------------------------------------------

function toolsPage() {
  document.title = 'Tools · planex console';
  const err = h('p', { class: 'error', role: 'alert' });
  const list = h('div', { id: 'tools' }, h('p', { class: 'muted' }, 'Loading…'));
  main.replaceChildren(h('h1', {}, 'Tools'), err, list);
  const ctl = new AbortController();
  call('ListTools', {}, ctl.signal).then((resp) => {
    const tools = resp.tools || [];
    list.replaceChildren(...(tools.length ? tools.map((t) => {
      const s = t.spec || {};
      return h('article', { class: 'panel', dataset: { tool: s.name } },
        h('h2', {}, h('span', { class: 'mono' }, s.name), ' ', s.requiresApproval ? badge('waiting-approval', 'needs approval') : ''),
        h('p', {}, s.description || ''),
        h('dl', { class: 'meta' },
          h('dt', {}, 'Pool'), h('dd', {}, s.pool || '—'),
          h('dt', {}, 'Side effect'), h('dd', {}, words(enumName(s.sideEffect, 'SIDE_EFFECT_')) || '—'),
          h('dt', {}, 'Idempotent'), h('dd', {}, s.idempotent ? 'yes' : 'no'),
          h('dt', {}, 'Default timeout'), h('dd', {}, duration(s.defaultTimeout)),
          h('dt', {}, 'Sensitive fields'), h('dd', {}, (s.sensitiveFields || []).join(', ') || '—'),
          h('dt', {}, 'Replicas'), h('dd', {}, (t.replicas || []).join(', ') || 'none')),
        h('details', {}, h('summary', {}, 'Argument schema'), json(s.argsSchema || {})),
        h('details', {}, h('summary', {}, 'Output schema'), json(s.outputSchema || {})));
    }) : [h('p', { class: 'muted' }, 'No tools registered.')]));
  }).catch((e) => { if (e.name !== 'AbortError') showError(err, e); });
  return () => ctl.abort();
}

route();
