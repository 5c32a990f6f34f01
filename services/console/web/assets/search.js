// The runs page's search (all of it in the URL: #/runs?goal=…&selector=…),
// saved views (name → URL, in localStorage) and batch actions over what
// the search selects (RunBatch: dry run, typed count, progress stream).
import { call, stream, RPCError } from './connect.js';
import { h, words, fieldError, modal, announce } from './ui.js';

export const runStatuses = ['PENDING', 'PLANNING', 'RUNNING', 'WAITING', 'SUCCEEDED', 'FAILED', 'ESCALATED', 'CANCELLED'];
export const stopReasons = ['SUCCEEDED', 'FAILED', 'STEP_FAILED', 'STEP_TIMEOUT', 'NO_DATA', 'BUDGET_EXCEEDED', 'DEADLINE', 'ESCALATED', 'REJECTED', 'CANCELLED', 'PLANNER_ERROR', 'STALLED'];
const ranges = { '': 'Any time', '1h': 'Last hour', '1d': 'Last day', '7d': 'Last week', custom: 'Custom…' };
const rangeMs = { '1h': 3600e3, '1d': 86400e3, '7d': 7 * 86400e3 };

/** searchKeys are the URL parameters of a search, in URL order. */
export const searchKeys = ['goal', 'status', 'label', 'selector', 'tool', 'by', 'since', 'after', 'before', 'stop', 'waiting'];

/** searchParams reads a search from the route's parameters. */
export function searchParams(params) {
  const sp = {};
  for (const k of searchKeys) sp[k] = (params.get(k) || '').trim();
  if (sp.waiting && sp.waiting !== '1') sp.waiting = '1';
  return sp;
}

const list = (v) => v.split(',').map((x) => x.trim()).filter(Boolean);
const localISO = (v) => { const d = new Date(v); return Number.isNaN(d.getTime()) ? '' : d.toISOString(); };

/**
 * filterOf turns a search into a RunFilter (protojson). now fixes "last
 * hour" once per page, so page tokens stay valid for the same filter.
 */
export function filterOf(sp, now = Date.now()) {
  const f = {};
  if (sp.status) f.statuses = list(sp.status).map((s) => 'RUN_STATUS_' + s.toUpperCase());
  if (sp.label) { const i = sp.label.indexOf('='); f.labels = { [sp.label.slice(0, i)]: sp.label.slice(i + 1) }; }
  if (sp.selector) f.labelSelector = sp.selector;
  if (sp.goal) f.goalContains = sp.goal;
  if (sp.tool) f.tools = list(sp.tool);
  if (sp.by) f.startedBy = sp.by;
  if (rangeMs[sp.since]) f.createdAfter = new Date(now - rangeMs[sp.since]).toISOString();
  if (sp.since === 'custom') {
    if (sp.after && localISO(sp.after)) f.createdAfter = localISO(sp.after);
    if (sp.before && localISO(sp.before)) f.createdBefore = localISO(sp.before);
  }
  if (sp.stop) f.stopReasons = list(sp.stop).map((s) => 'STOP_REASON_' + s.toUpperCase());
  if (sp.waiting) f.waitingForDecision = true;
  return f;
}

/**
 * listRequest is the ListRuns request of a search: status and label also
 * in the request's own fields (as before the filter existed), the rest in
 * filter.
 */
export function listRequest(sp, now) {
  const f = filterOf(sp, now);
  const req = {};
  if (sp.waiting) req.statuses = ['RUN_STATUS_WAITING'];
  else if (f.statuses) req.statuses = f.statuses;
  if (f.labels) req.labels = f.labels;
  const rest = { ...f };
  delete rest.statuses;
  delete rest.labels;
  if (Object.keys(rest).length) req.filter = rest;
  return req;
}

/** describeSearch says in words what a search selects. */
export function describeSearch(sp) {
  const parts = [];
  if (sp.goal) parts.push(`goal contains "${sp.goal}"`);
  if (sp.status) parts.push('status ' + list(sp.status).map((s) => words(s.toLowerCase())).join(' or '));
  if (sp.label) parts.push('label ' + sp.label);
  if (sp.selector) parts.push('labels ' + sp.selector);
  if (sp.tool) parts.push('calls ' + list(sp.tool).join(' or '));
  if (sp.by) parts.push('started by ' + sp.by);
  if (rangeMs[sp.since]) parts.push('created in the ' + ranges[sp.since].toLowerCase());
  if (sp.since === 'custom') parts.push(`created ${sp.after ? 'from ' + sp.after : ''}${sp.before ? ' before ' + sp.before : ''}`.trim());
  if (sp.stop) parts.push('stopped ' + list(sp.stop).map((s) => words(s.toLowerCase().replace(/_/g, '-'))).join(' or '));
  if (sp.waiting) parts.push('waiting for a decision');
  return parts.length ? parts.join(', ') : 'every run';
}

const selectorRe = /^\s*(!?[A-Za-z0-9_.\-/]+(\s*(=|==|!=)\s*[^,()]*|\s+(in|notin)\s+\([^)]*\))?)(\s*,\s*(!?[A-Za-z0-9_.\-/]+(\s*(=|==|!=)\s*[^,()]*|\s+(in|notin)\s+\([^)]*\))?))*\s*$/;

/**
 * searchForm is the search form of sp; submitting calls setParams with
 * the new search (page reset). tools are tool names for the tool field.
 */
export function searchForm(sp, setParams) {
  const field = (id, label, input, help) => h('div', {}, h('label', { for: id }, label), input, help || '');
  const text = (id, value, extra) => h('input', { id, value, ...extra });
  const goal = text('f-goal', sp.goal, { type: 'search', placeholder: 'words in the goal' });
  const status = h('select', { id: 'f-status' }, h('option', { value: '' }, 'Any status'),
    runStatuses.map((s) => h('option', { value: s, selected: list(sp.status).includes(s) }, words(s.toLowerCase()))));
  const label = text('f-label', sp.label, { placeholder: 'team=billing', 'aria-describedby': 'f-label-error' });
  const labelErr = h('p', { id: 'f-label-error', class: 'field-error', role: 'alert' });
  const selector = text('f-selector', sp.selector, { placeholder: 'team in (ops,billing),!draft', 'aria-describedby': 'f-selector-error' });
  const selectorErr = h('p', { id: 'f-selector-error', class: 'field-error', role: 'alert' });
  const tool = text('f-tool', sp.tool, { list: 'f-tools', placeholder: 'sql.query' });
  const tools = h('datalist', { id: 'f-tools' });
  call('ListTools', {}).then((r) => tools.replaceChildren(...(r.tools || []).map((t) => h('option', { value: t.spec.name })))).catch(() => {});
  const by = text('f-by', sp.by, { placeholder: 'identity' });
  const since = h('select', { id: 'f-since' }, Object.entries(ranges).map(([v, t]) => h('option', { value: v, selected: v === sp.since }, t)));
  const after = text('f-after', sp.after, { type: 'datetime-local' });
  const before = text('f-before', sp.before, { type: 'datetime-local' });
  const custom = h('div', { class: 'row', hidden: sp.since !== 'custom' }, field('f-after', 'Created from', after), field('f-before', 'Created before', before));
  since.addEventListener('change', () => { custom.hidden = since.value !== 'custom'; });
  const stop = h('select', { id: 'f-stop' }, h('option', { value: '' }, 'Any stop reason'),
    stopReasons.map((s) => h('option', { value: s, selected: list(sp.stop).includes(s) }, words(s.toLowerCase().replace(/_/g, '-')))));
  const waiting = h('input', { id: 'f-waiting', type: 'checkbox', checked: !!sp.waiting });
  const values = () => ({ goal: goal.value.trim(), status: status.value, label: label.value.trim(), selector: selector.value.trim(), tool: tool.value.trim(),
    by: by.value.trim(), since: since.value, after: since.value === 'custom' ? after.value : '', before: since.value === 'custom' ? before.value : '',
    stop: stop.value, waiting: waiting.checked ? '1' : '' });
  const submit = (e) => {
    if (e) e.preventDefault();
    const v = values();
    fieldError(label, labelErr, v.label && !/^[^=\s]+=.*$/.test(v.label) ? 'Label filter: want key=value.' : '');
    if (labelErr.textContent) return;
    fieldError(selector, selectorErr, v.selector && !selectorRe.test(v.selector) ? 'Label selector: want key=value, key!=value, key in (a,b), key notin (a,b), key or !key, separated by commas.' : '');
    if (selectorErr.textContent) return;
    setParams({ ...v, page: '' });
  };
  // The select and checkbox filters apply at once, as before.
  for (const e of [status, stop, waiting]) e.addEventListener('change', () => submit());
  return h('form', { class: 'panel search', id: 'search', role: 'search', 'aria-label': 'Search runs', onsubmit: submit },
    h('div', { class: 'row' },
      h('div', { class: 'grow' }, h('label', { for: 'f-goal' }, 'Goal contains'), goal),
      field('f-status', 'Status', status),
      field('f-stop', 'Stop reason', stop),
      field('f-since', 'Created', since)),
    custom,
    h('div', { class: 'row' },
      field('f-label', 'Label', label),
      h('div', { class: 'grow' }, h('label', { for: 'f-selector' }, 'Label selector'), selector),
      field('f-tool', 'Tool', tool, tools),
      field('f-by', 'Started by', by),
      h('div', {}, h('span', { class: 'check' }, waiting, h('label', { for: 'f-waiting' }, 'Waiting for a decision'))),
      h('div', {}, h('button', { type: 'submit', class: 'secondary' }, 'Search'))),
    labelErr, selectorErr);
}

// ---- saved views ------------------------------------------------------------

const viewsKey = 'planex.console.views';

/** views are the saved views: [{name, hash}], in the order saved. */
export function views() {
  try { const v = JSON.parse(localStorage.getItem(viewsKey) || '[]'); return Array.isArray(v) ? v.filter((x) => x && x.name && x.hash) : []; } catch { return []; }
}
function storeViews(v) { localStorage.setItem(viewsKey, JSON.stringify(v)); }

/** savedViews is the saved-views panel; hash is the current search's route. */
export function savedViews(hash) {
  const listEl = h('ul', { class: 'views', id: 'views' });
  const name = h('input', { id: 'view-name', placeholder: 'failed billing runs', 'aria-describedby': 'view-name-error' });
  const nameErr = h('p', { id: 'view-name-error', class: 'field-error', role: 'alert' });
  const draw = () => {
    const vs = views();
    listEl.replaceChildren(...(vs.length ? vs.map((v, i) => h('li', {},
      h('a', { href: v.hash, 'aria-current': v.hash === hash ? 'page' : false }, v.name), ' ',
      h('button', { type: 'button', class: 'link', 'aria-label': 'Delete the view ' + v.name, onclick: () => { const all = views(); all.splice(i, 1); storeViews(all); draw(); } }, 'delete')))
      : [h('li', { class: 'muted' }, 'No saved views yet.')]));
  };
  draw();
  const save = (e) => {
    e.preventDefault();
    const n = name.value.trim();
    fieldError(name, nameErr, n ? '' : 'Name the view.');
    if (!n) return;
    const vs = views().filter((v) => v.name !== n);
    vs.push({ name: n, hash });
    storeViews(vs);
    name.value = '';
    draw();
    announce(`Saved the view ${n}`);
  };
  return h('details', { class: 'panel views-panel' }, h('summary', {}, 'Saved views'),
    listEl,
    h('form', { class: 'row', onsubmit: save, 'aria-label': 'Save this search' },
      h('div', { class: 'grow' }, h('label', { for: 'view-name' }, 'Save this search as'), name),
      h('div', {}, h('button', { type: 'submit', class: 'secondary', id: 'save-view' }, 'Save view'))),
    nameErr,
    h('p', { class: 'muted' }, 'Views are kept in this browser. To share one, share the page\'s address: the whole search is in it.'));
}

// ---- batch actions ------------------------------------------------------------

const ops = {
  cancel: { button: 'Cancel…', title: 'Cancel the runs this search selects', verb: 'Cancel', op: () => ({ cancel: {} }) },
  approve: { button: 'Approve gates…', title: 'Approve the open gates of the runs this search selects', verb: 'Approve', op: () => ({ decide: { decision: 'DECISION_KIND_APPROVE' } }) },
  reject: { button: 'Reject gates…', title: 'Reject the open gates of the runs this search selects', verb: 'Reject', op: (o) => ({ decide: { decision: 'DECISION_KIND_REJECT', stopRun: o.stopRun } }) },
  reset: { button: 'Reset…', title: 'Reset the finished runs this search selects', verb: 'Reset', op: (o) => ({ reset: { replan: o.replan } }) },
};

/**
 * batchBar holds the batch actions over the runs sp selects. showError
 * handles errors the page handles (sign-in).
 */
export function batchBar(sp, showError) {
  return h('div', { class: 'row batch', role: 'group', 'aria-label': 'Batch actions on the runs this search selects' },
    h('span', { class: 'muted' }, 'With every run this search selects:'),
    Object.entries(ops).map(([k, o]) => h('button', { type: 'button', class: k === 'approve' ? 'secondary' : 'secondary', id: 'batch-' + k, onclick: () => batchDialog(k, sp, showError) }, o.button)));
}

const num = (v) => Number(v || 0);

function batchDialog(kind, sp, showError) {
  const o = ops[kind];
  const filter = filterOf(sp);
  const count = h('p', { id: 'batch-count', role: 'status' }, 'Counting the runs (dry run)…');
  const sample = h('ul', { class: 'sample', id: 'batch-sample' });
  const reason = h('input', { id: 'batch-reason', 'aria-describedby': 'batch-reason-error', required: true });
  const reasonErr = h('p', { id: 'batch-reason-error', class: 'field-error', role: 'alert' });
  const stopRun = h('input', { type: 'checkbox', id: 'batch-stop' });
  const replan = h('input', { type: 'checkbox', id: 'batch-replan' });
  const confirmIn = h('input', { id: 'batch-confirm', inputmode: 'numeric', autocomplete: 'off', 'aria-describedby': 'batch-confirm-help batch-confirm-error' });
  const confirmHelp = h('p', { id: 'batch-confirm-help', class: 'muted' });
  const confirmErr = h('p', { id: 'batch-confirm-error', class: 'field-error', role: 'alert' });
  const err = h('p', { class: 'error', role: 'alert', id: 'batch-error' });
  const run = h('button', { type: 'submit', class: kind === 'approve' ? '' : 'danger', id: 'batch-run', disabled: true }, o.verb);
  const bar = h('progress', { id: 'batch-progress', max: 1, value: 0, hidden: true });
  const progress = h('p', { id: 'batch-status', role: 'status' });
  const failures = h('ul', { id: 'batch-failures', class: 'failures' });
  let matched = -1;
  let busy = false;
  const ctl = new AbortController();

  const form = h('form', { onsubmit: async (e) => {
    e.preventDefault();
    if (busy || matched < 0) return;
    fieldError(reason, reasonErr, reason.value.trim() ? '' : 'Give a reason: it is recorded in each run\'s log.');
    if (reasonErr.textContent) return;
    fieldError(confirmIn, confirmErr, confirmIn.value.trim() === String(matched) ? '' : `Type ${matched} to confirm.`);
    if (confirmErr.textContent) return;
    busy = true;
    run.disabled = true;
    err.textContent = '';
    bar.hidden = false;
    bar.max = Math.max(1, matched);
    progress.textContent = `Started: 0 of ${matched} done.`;
    const req = { filter, ...o.op({ stopRun: stopRun.checked, replan: replan.checked }), expectedCount: String(matched), reason: reason.value.trim(), actor: 'console', batchId: requestId };
    try {
      let last = null;
      for await (const m of stream('RunBatch', req, ctl.signal)) {
        last = m;
        bar.value = num(m.done);
        progress.textContent = `${num(m.done)} of ${num(m.matched) || matched} done, ${num(m.failed)} failed${m.finished ? ' — finished.' : '…'}`;
        for (const it of m.items || []) {
          if (it.outcome === 'failed') failures.append(h('li', { dataset: { runId: it.runId } }, h('a', { href: '#/runs/' + encodeURIComponent(it.runId), class: 'mono' }, it.runId), ': ', it.message || 'failed'));
        }
      }
      progress.dataset.finished = '1';
      if (last) { progress.dataset.done = String(num(last.done)); progress.dataset.failed = String(num(last.failed)); }
      announce(progress.textContent);
    } catch (e2) {
      if (e2.name === 'AbortError') return;
      busy = false;
      if (e2 instanceof RPCError && /expected_count|now selects/.test(e2.message)) {
        fieldError(confirmIn, confirmErr, e2.message + ' Count again before running the batch.');
        dryRun();
      } else if (e2 instanceof RPCError && /reason/.test(e2.message)) fieldError(reason, reasonErr, e2.message);
      else if (!showError(err, e2)) run.disabled = false;
    }
  } },
  h('p', {}, 'Runs: ', describeSearch(sp), '.'),
  count, sample,
  h('div', { class: 'row' }, h('div', { class: 'grow' }, h('label', { for: 'batch-reason' }, 'Reason (recorded in each run\'s log)'), reason)),
  reasonErr,
  kind === 'reject' ? h('p', { class: 'check' }, stopRun, h('label', { for: 'batch-stop' }, 'Stop the runs (otherwise each goes back to its planner with the reason)')) : '',
  kind === 'reset' ? h('p', { class: 'check' }, replan, h('label', { for: 'batch-replan' }, 'Send each run back to its planner instead of dispatching the steps again')) : '',
  h('div', { class: 'row' }, h('div', {}, h('label', { for: 'batch-confirm' }, 'Confirm the count'), confirmIn)),
  confirmHelp, confirmErr,
  h('div', { class: 'actions row' }, run, h('button', { type: 'button', class: 'secondary', onclick: () => dlg.close() }, 'Close')),
  err, bar, progress, failures);
  const requestId = 'console-' + (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()));
  const dlg = modal(o.title, form, () => ctl.abort());

  async function dryRun() {
    matched = -1;
    run.disabled = true;
    count.textContent = 'Counting the runs (dry run)…';
    try {
      let answer = null;
      for await (const m of stream('RunBatch', { filter, ...o.op({ stopRun: false, replan: false }), dryRun: true }, ctl.signal)) if (!answer) answer = m;
      matched = num(answer && answer.matched);
      count.dataset.count = String(matched);
      count.textContent = `${matched} run${matched === 1 ? '' : 's'} match${matched === 1 ? 'es' : ''}.`;
      const ids = (answer && answer.sampleRunIds) || [];
      sample.replaceChildren(...ids.map((id) => h('li', {}, h('a', { href: '#/runs/' + encodeURIComponent(id), class: 'mono' }, id))));
      if (ids.length && ids.length < matched) sample.append(h('li', { class: 'muted' }, `and ${matched - ids.length} more`));
      confirmHelp.textContent = matched ? `Type ${matched} to confirm: the batch is refused if the search selects another number of runs by then.` : 'Nothing to do.';
      run.disabled = matched === 0;
      if (matched) reason.focus();
    } catch (e) {
      if (e.name === 'AbortError') return;
      count.textContent = '';
      if (!showError(err, e)) err.textContent = 'Dry run refused: ' + err.textContent;
    }
  }
  dryRun();
}
