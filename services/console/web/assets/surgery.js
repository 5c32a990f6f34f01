// Run surgery in the run page: the Raw and JSON tabs, the history of
// resets and forks, and the reset and fork dialogs (ResetRun, ForkRun:
// reason, replan, the step's arguments checked against the tool's schema,
// decisions on unknown outcomes, and a dry-run preview before the real
// call).
import { call, RPCError } from './connect.js';
import { h, enumName, stepStatus, words, time, hex, fieldError, modal } from './ui.js';
import { validate } from './schema.js';

// ---- tabs -------------------------------------------------------------------

/**
 * runTabs lays panels [{id, label, el}] out as tabs (the ARIA tabs
 * pattern: arrow keys move between tabs); the first one is shown. It
 * returns {el, show(id)}; onShow(id) runs when a tab is shown.
 */
export function runTabs(panels, onShow) {
  const tabs = [];
  const list = h('div', { role: 'tablist', class: 'tabs', 'aria-label': 'Run views' });
  const show = (id, focus) => {
    for (const t of tabs) {
      const on = t.id === id;
      t.tab.setAttribute('aria-selected', on ? 'true' : 'false');
      t.tab.tabIndex = on ? 0 : -1;
      t.el.hidden = !on;
      if (on && focus) t.tab.focus();
    }
    if (onShow) onShow(id);
  };
  panels.forEach((p, i) => {
    const tab = h('button', { type: 'button', role: 'tab', id: 'tab-' + p.id, 'aria-controls': 'panel-' + p.id, onclick: () => show(p.id) }, p.label);
    tab.addEventListener('keydown', (e) => {
      const d = e.key === 'ArrowRight' ? 1 : e.key === 'ArrowLeft' ? -1 : 0;
      if (d) { e.preventDefault(); show(panels[(i + d + panels.length) % panels.length].id, true); }
    });
    p.el.id = 'panel-' + p.id;
    p.el.setAttribute('role', 'tabpanel');
    p.el.setAttribute('aria-labelledby', 'tab-' + p.id);
    tabs.push({ id: p.id, tab, el: p.el });
    list.append(tab);
  });
  show(panels[0].id);
  return { el: h('div', {}, list, panels.map((p) => p.el)), show };
}

// ---- raw events -------------------------------------------------------------

const envelope = new Set(['runId', 'sequence', 'time', 'prevHash', 'hash']);

/** payloadKind is the name of an event's payload field ("stepSucceeded"). */
export function payloadKind(ev) { return Object.keys(ev).find((k) => !envelope.has(k)) || ''; }

// A hash shown short, whole in its title and while focused.
function hashCell(b64) {
  const full = hex(b64);
  if (!full) return h('td', { class: 'muted' }, '—');
  const short = full.slice(0, 12) + '…';
  const s = h('span', { class: 'mono hash', tabindex: '0', title: full, 'aria-label': full, dataset: { full } }, short);
  s.addEventListener('focus', () => { s.textContent = full; });
  s.addEventListener('blur', () => { s.textContent = short; });
  return h('td', {}, s);
}

/** rawEventRow is an event as stored: sequence, time, kind, hashes, payload. */
export function rawEventRow(ev) {
  const kind = payloadKind(ev);
  return h('tr', { dataset: { seq: ev.sequence, kind } },
    h('td', { class: 'mono' }, String(ev.sequence)),
    h('td', {}, ev.time ? h('time', { datetime: ev.time, title: ev.time }, ev.time) : '—'),
    h('td', { class: 'mono' }, kind),
    hashCell(ev.prevHash), hashCell(ev.hash),
    h('td', {}, h('details', {}, h('summary', {}, 'payload'), h('pre', { tabindex: '0' }, JSON.stringify(ev[kind] ?? {}, null, 2)))));
}

/** rawTable is the Raw tab's table; append rows with rawEventRow. */
export function rawTable() {
  const body = h('tbody', {});
  const el = h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': 'Events as stored' }, h('table', { class: 'raw', id: 'raw-events' },
    h('caption', { class: 'visually-hidden' }, 'The run log, oldest first'),
    h('colgroup', {}, h('col', { class: 'seq' }), h('col', { class: 'time' }), h('col', { class: 'kind' }), h('col', { class: 'hash' }), h('col', { class: 'hash' }), h('col', {})),
    h('thead', {}, h('tr', {}, ['Seq', 'Time', 'Kind', 'Previous hash', 'Hash', 'Payload'].map((t) => h('th', { scope: 'col' }, t)))),
    body));
  return { el, body };
}

/** jsonPanel shows the run as JSON with a copy button; update(run) refreshes it. */
export function jsonPanel() {
  const pre = h('pre', { id: 'run-json', tabindex: '0', class: 'tall' });
  const state = h('span', { role: 'status', class: 'muted', id: 'copy-state' });
  const copy = h('button', { type: 'button', class: 'secondary', id: 'copy-json', onclick: async () => {
    try { await navigator.clipboard.writeText(pre.textContent); state.textContent = 'Copied.'; } catch {
      const r = document.createRange(); r.selectNodeContents(pre); const sel = getSelection(); sel.removeAllRanges(); sel.addRange(r);
      state.textContent = 'Selected: copy with Ctrl+C.';
    }
  } }, 'Copy JSON');
  return { el: h('div', {}, h('div', { class: 'row actions' }, copy, state), pre), update: (run) => { pre.textContent = JSON.stringify(run, null, 2); } };
}

// ---- history ------------------------------------------------------------------

/**
 * historySection describes resets (RunReset events) and forks both ways; update
 * it with the run and the events seen so far.
 */
export function historySection() {
  const el = h('div', { id: 'run-history' });
  const update = (run, events) => {
    const items = [];
    const fo = run.forkedFrom;
    if (fo && fo.runId) {
      items.push(h('li', { class: 'forked-from' }, 'Forked from ', h('a', { href: '#/runs/' + encodeURIComponent(fo.runId), class: 'mono', id: 'forked-from-link' }, fo.runId),
        ` at event #${fo.sequence || '?'}`, fo.fromStep ? ` (from step ${fo.fromStep})` : '', fo.forkedBy ? ` by ${fo.forkedBy}` : '', fo.reason ? `: ${fo.reason}` : ''));
    }
    for (const ev of events) {
      const r = ev.runReset;
      if (!r) continue;
      const steps = (r.plan && r.plan.steps) || [];
      const kept = (r.plan && r.plan.lineage && r.plan.lineage.kept) || [];
      const rerun = steps.map((s) => s.id).filter((id) => !kept.includes(id));
      const from = r.fromStep ? `from step ${r.fromStep}` : r.toSequence && r.toSequence !== '0' ? `back to event #${r.toSequence}` : 'from the steps that did not succeed';
      items.push(h('li', { class: 'reset', dataset: { seq: ev.sequence } },
        h('strong', {}, 'Reset'), ' ', time(ev.time), ` by ${r.resetBy || r.actor || 'someone'}${r.actor && r.resetBy && r.actor !== r.resetBy ? ' (' + r.actor + ')' : ''}, ${from}`,
        r.batchId ? ` in batch ${r.batchId}` : '', r.previousStatus ? ` (was ${words(enumName(r.previousStatus, 'RUN_STATUS_'))})` : '', ': ', h('q', {}, r.reason || ''),
        h('ul', {},
          r.replan ? h('li', {}, 'Sent back to the planner.') : h('li', {}, 'Reran: ', rerun.join(', ') || 'none', '; kept: ', kept.join(', ') || 'none'),
          (r.keptSideEffects || []).length ? h('li', {}, 'Kept because their side effect happened: ', r.keptSideEffects.join(', ')) : '',
          (r.unknownOutcomes || []).length ? h('li', {}, 'Unknown outcomes: ', r.unknownOutcomes.map((u) => `${u.stepId} ${enumName(u.action, 'UNKNOWN_OUTCOME_ACTION_')}`).join(', ')) : '')));
    }
    const forkEvents = new Map(events.filter((e) => e.runForked).map((e) => [e.runForked.forkRunId, e]));
    for (const id of run.forks || []) {
      const f = (forkEvents.get(id) || {}).runForked || {};
      items.push(h('li', { class: 'fork' }, 'Fork ', h('a', { href: '#/runs/' + encodeURIComponent(id), class: 'mono fork-link' }, id),
        f.atSequence ? ` from event #${f.atSequence}` : '', f.forkedBy ? ` by ${f.forkedBy}` : '', f.reason ? `: ${f.reason}` : ''));
    }
    el.replaceChildren(items.length ? h('ul', { class: 'history' }, items) : h('p', { class: 'muted' }, 'Never reset or forked.'));
  };
  return { el, update };
}

// ---- reset and fork dialogs ---------------------------------------------------

let toolsCache = null;
function toolSchemas() {
  if (!toolsCache) {
    toolsCache = call('ListTools', {}).then((r) => new Map((r.tools || []).map((t) => [t.spec.name, t.spec.argsSchema || {}])))
      .catch((e) => { toolsCache = null; throw e; });
  }
  return toolsCache;
}

// latestStates are the newest state of each step id.
function latestStates(run) {
  const m = new Map();
  for (const s of run.steps || []) {
    const cur = m.get(s.stepId);
    if (!cur || (s.planRevision || 1) >= (cur.planRevision || 1)) m.set(s.stepId, s);
  }
  return m;
}

/**
 * openSurgery opens the reset or fork dialog ("reset" | "fork") of run,
 * from stepId (or, without one, from the steps that did not succeed).
 * done(kind, response) runs after the real call; showError handles
 * sign-in.
 */
export function openSurgery(kind, run, stepId, { showError, done }) {
  const fork = kind === 'fork';
  const plans = run.plans || [];
  const plan = plans[plans.length - 1] || { steps: [] };
  const spec = stepId ? (plan.steps || []).find((s) => s.id === stepId) : null;
  const requestId = 'console-' + (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()));
  const ctl = new AbortController();

  const reason = h('input', { id: 'op-reason', required: true, 'aria-describedby': 'op-reason-error' });
  const reasonErr = h('p', { id: 'op-reason-error', class: 'field-error', role: 'alert' });
  const replan = h('input', { type: 'checkbox', id: 'op-replan' });
  const goal = h('input', { id: 'op-goal', placeholder: run.goal, 'aria-describedby': 'op-goal-error' });
  const goalErr = h('p', { id: 'op-goal-error', class: 'field-error', role: 'alert' });
  const labels = h('input', { id: 'op-labels', placeholder: 'experiment=fix-1, owner=me', 'aria-describedby': 'op-labels-error' });
  const labelsErr = h('p', { id: 'op-labels-error', class: 'field-error', role: 'alert' });
  const initialArgs = spec ? JSON.stringify(spec.args || {}, null, 2) : '';
  const args = h('textarea', { id: 'op-args', spellcheck: 'false', rows: 8, 'aria-describedby': 'op-args-help op-args-error' });
  args.defaultValue = initialArgs;
  args.value = initialArgs;
  const argsErr = h('p', { id: 'op-args-error', class: 'field-error', role: 'alert' });
  const unknownBox = h('fieldset', { id: 'op-unknown', hidden: true }, h('legend', {}, 'Steps whose outcome is unknown'));
  const unknownErr = h('p', { id: 'op-unknown-error', class: 'field-error', role: 'alert' });
  const previewOut = h('div', { id: 'op-preview-out', role: 'status' });
  const err = h('p', { class: 'error', role: 'alert', id: 'op-error' });
  const previewBtn = h('button', { type: 'button', class: 'secondary', id: 'op-preview' }, 'Preview (dry run)');
  const confirmBtn = h('button', { type: 'submit', id: 'op-confirm', disabled: true, class: fork ? '' : 'danger' }, fork ? 'Fork the run' : 'Reset the run');
  const states = latestStates(run);
  const unknownRows = new Map(); // step id → {select, output}

  // A step whose outcome is unknown needs a decision before it may start
  // over: one row per such step the preview or a refusal names.
  const askUnknown = (ids) => {
    for (const id of ids) {
      if (unknownRows.has(id)) continue;
      const key = id.replace(/[^A-Za-z0-9_-]/g, '_');
      const select = h('select', { id: 'uo-' + key, dataset: { stepId: id } }, h('option', { value: '' }, 'Decide…'),
        h('option', { value: 'UNKNOWN_OUTCOME_ACTION_RETRY' }, 'Run it again (its effect may happen twice)'),
        h('option', { value: 'UNKNOWN_OUTCOME_ACTION_DONE' }, 'It happened: count it as succeeded'));
      const output = h('textarea', { id: 'uo-output-' + key, rows: 3, spellcheck: 'false', hidden: true, 'aria-label': `Output of ${id} (JSON)` });
      output.value = 'null';
      select.addEventListener('change', () => { output.hidden = select.value !== 'UNKNOWN_OUTCOME_ACTION_DONE'; stale(); });
      unknownRows.set(id, { select, output });
      const st = states.get(id);
      unknownBox.append(h('div', { class: 'unknown-row' }, h('label', { for: 'uo-' + key }, `${id} (${(st && st.tool) || '?'}): `), select, output));
    }
    unknownBox.hidden = unknownRows.size === 0;
  };
  const unknownIn = (ids) => ids.filter((id) => (states.get(id) || {}).status === 'STEP_STATUS_OUTCOME_UNKNOWN');

  // Any change after a preview needs a new one before the real call.
  let previewed = false;
  const stale = () => { if (previewed) { previewed = false; confirmBtn.disabled = true; previewOut.dataset.stale = '1'; } };

  const clear = () => { for (const [i, e] of [[reason, reasonErr], [goal, goalErr], [labels, labelsErr], [args, argsErr]]) fieldError(i, e, ''); unknownErr.textContent = ''; err.textContent = ''; };

  // request builds the request from the fields, or shows the first
  // problem at its field and returns null.
  async function request(dryRun) {
    clear();
    if (!reason.value.trim()) { fieldError(reason, reasonErr, 'Give a reason: it is recorded in the run\'s log.'); return null; }
    const req = { runId: run.id, reason: reason.value.trim(), replan: replan.checked, requestId, dryRun };
    if (stepId) req.fromStep = stepId;
    if (spec && args.value.trim() !== initialArgs.trim()) {
      let v;
      try { v = JSON.parse(args.value); } catch (e) { fieldError(args, argsErr, 'Arguments: not valid JSON (' + e.message + ').'); return null; }
      if (v === null || typeof v !== 'object' || Array.isArray(v)) { fieldError(args, argsErr, 'Arguments: want a JSON object.'); return null; }
      let schemas = null;
      try { schemas = await toolSchemas(); } catch { /* the supervisor checks */ }
      const problems = schemas && schemas.has(spec.tool) ? validate(schemas.get(spec.tool), v) : [];
      if (problems.length) { fieldError(args, argsErr, `Arguments do not fit ${spec.tool}'s schema: ` + problems.map((p) => `${p.path}: ${p.message}`).join('; ')); return null; }
      req.stepArgs = { [stepId]: v };
    }
    if (fork) {
      if (goal.value.trim()) req.goal = goal.value.trim();
      if (labels.value.trim()) {
        const m = {};
        for (const part of labels.value.split(',').map((x) => x.trim()).filter(Boolean)) {
          const i = part.indexOf('=');
          if (i <= 0) { fieldError(labels, labelsErr, `Labels: "${part}" is not key=value.`); return null; }
          m[part.slice(0, i).trim()] = part.slice(i + 1).trim();
        }
        req.labels = m;
      }
    } else {
      req.actor = 'console';
      const decided = [];
      for (const [id, r] of unknownRows) {
        if (!r.select.value) continue;
        const d = { stepId: id, action: r.select.value };
        if (r.select.value === 'UNKNOWN_OUTCOME_ACTION_DONE') {
          try { d.output = JSON.parse(r.output.value || 'null'); } catch (e) { unknownErr.textContent = `Output of ${id}: not valid JSON (${e.message}).`; r.output.setAttribute('aria-invalid', 'true'); r.output.focus(); return null; }
        }
        decided.push(d);
      }
      if (decided.length) req.unknownOutcomes = decided;
    }
    return req;
  }

  // refused shows a server error at the field it names.
  function refused(e) {
    if (!(e instanceof RPCError)) { err.textContent = String(e); return; }
    const m = e.message;
    if (/step_args|args/.test(m) && spec) fieldError(args, argsErr, m);
    else if (/unknown_outcome|outcome is unknown|outcome unknown/i.test(m)) {
      // The refusal names the steps that need a decision (outcome unknown,
      // or still in flight when the run stopped).
      const named = [...m.matchAll(/"([^"]+)"/g)].map((x) => x[1]).filter((id) => states.has(id));
      askUnknown(named.length ? named : unknownIn([...states.keys()]));
      unknownErr.textContent = m;
    } else if (/reason/.test(m)) fieldError(reason, reasonErr, m);
    else if (/goal/.test(m) && fork) fieldError(goal, goalErr, m);
    else if (/labels/.test(m) && fork) fieldError(labels, labelsErr, m);
    else if (!showError(err, e)) { /* shown */ }
  }

  const list = (title, ids, cls) => h('div', { class: cls }, h('h3', {}, title), ids.length ? h('ul', {}, ids.map((id) => h('li', { class: 'mono', dataset: { stepId: id } }, id))) : h('p', { class: 'muted' }, 'none'));

  previewBtn.addEventListener('click', async () => {
    const req = await request(true);
    if (!req) return;
    previewBtn.disabled = true;
    previewOut.textContent = 'Asking the supervisor (dry run)…';
    try {
      const resp = await call(fork ? 'ForkRun' : 'ResetRun', req, ctl.signal);
      const rerun = resp.rerun || [];
      previewOut.replaceChildren(fork
        ? h('div', { class: 'grid2' }, list('Runs again in the fork', rerun, 'rerun'), list('Shared (not executed again)', resp.shared || [], 'kept'))
        : h('div', { class: 'grid2' }, list('Starts over', rerun, 'rerun'), list('Kept', resp.kept || [], 'kept'),
          (resp.keptSideEffects || []).length ? list('Kept because their side effect happened (never repeated)', resp.keptSideEffects, 'kept-side-effects') : ''));
      delete previewOut.dataset.stale;
      previewOut.dataset.ready = '1';
      askUnknown(unknownIn(rerun));
      const undecided = [...unknownRows].filter(([id, r]) => rerun.includes(id) && !r.select.value).map(([id]) => id);
      if (!fork && undecided.length) {
        unknownErr.textContent = `Decide what to do with ${undecided.join(', ')} (outcome unknown) before resetting.`;
        return;
      }
      previewed = true;
      confirmBtn.disabled = false;
      confirmBtn.focus();
    } catch (e) {
      if (e.name === 'AbortError') return;
      previewOut.textContent = '';
      refused(e);
    } finally { previewBtn.disabled = false; }
  });

  const form = h('form', { onsubmit: async (e) => {
    e.preventDefault();
    if (!previewed) return;
    const req = await request(false);
    if (!req) return;
    confirmBtn.disabled = true;
    try {
      const resp = await call(fork ? 'ForkRun' : 'ResetRun', req, ctl.signal);
      dlg.close();
      done(kind, resp);
    } catch (e2) {
      if (e2.name === 'AbortError') return;
      confirmBtn.disabled = false;
      refused(e2);
    }
  } },
  h('p', { class: 'muted' }, fork
    ? (stepId ? `The fork shares every result except ${stepId}'s and its dependents', which it runs again.` : 'The fork shares the whole history and runs the steps that did not succeed.')
    : (stepId ? `${stepId} and every step that depends on it start over; the other results stand. A step whose side effect happened is never repeated.` : 'The steps that did not succeed start over; the other results stand.')),
  h('div', { class: 'row' }, h('div', { class: 'grow' }, h('label', { for: 'op-reason' }, 'Reason (required, recorded in the log)'), reason)), reasonErr,
  fork ? [h('div', { class: 'row' }, h('div', { class: 'grow' }, h('label', { for: 'op-goal' }, 'Goal of the fork (empty: the same)'), goal)), goalErr,
    h('div', { class: 'row' }, h('div', { class: 'grow' }, h('label', { for: 'op-labels' }, 'Labels to add or replace (key=value, …)'), labels)), labelsErr] : '',
  h('p', { class: 'check' }, replan, h('label', { for: 'op-replan' }, fork ? 'Plan again from the shared history' : 'Send the run back to the planner (the reason is its replan reason)')),
  spec ? [h('label', { for: 'op-args' }, `Arguments of ${stepId} (${spec.tool}, JSON)`),
    h('p', { id: 'op-args-help', class: 'muted' }, 'As the plan has them; change them to run the step with others. Checked against the tool\'s schema here, then by the supervisor.'),
    args, argsErr] : '',
  unknownBox, unknownErr,
  h('div', { class: 'actions row' }, previewBtn, confirmBtn, h('button', { type: 'button', class: 'secondary', onclick: () => dlg.close() }, 'Cancel')),
  err, previewOut);
  for (const e of [reason, replan, goal, labels, args]) e.addEventListener('input', stale);
  replan.addEventListener('change', stale);
  const title = fork ? (stepId ? `Fork from step ${stepId}` : 'Fork this run') : (stepId ? `Reset from step ${stepId}` : 'Reset this run');
  const dlg = modal(title, form, () => ctl.abort());
  // Pre-existing unknown outcomes among the steps that would start over
  // are asked for up front.
  if (!fork) askUnknown(unknownIn(stepId ? [stepId] : [...states.keys()].filter((id) => stepStatus(states.get(id)) !== 'succeeded')));
  reason.focus();
  return dlg;
}

/**
 * surgeryButtons are the run page's reset and fork buttons: with a step
 * selected, from that step; without, reset from the failed steps (a
 * finished run only) and fork.
 */
export function surgeryButtons(run, finished, stepId, open) {
  const out = [];
  if (stepId) {
    if (finished) out.push(h('button', { type: 'button', class: 'danger', id: 'reset-step', onclick: () => open('reset', stepId) }, `Reset from ${stepId}`));
    out.push(h('button', { type: 'button', class: 'secondary', id: 'fork-step', onclick: () => open('fork', stepId) }, `Fork from ${stepId}`));
  } else {
    if (finished && run.status !== 'RUN_STATUS_SUCCEEDED') out.push(h('button', { type: 'button', class: 'danger', id: 'reset-run', onclick: () => open('reset', null) }, 'Reset run'));
    if (run.plans && run.plans.length) out.push(h('button', { type: 'button', class: 'secondary', id: 'fork-run', onclick: () => open('fork', null) }, 'Fork run'));
  }
  return out;
}
