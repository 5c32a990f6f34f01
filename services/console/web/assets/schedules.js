// The Schedules page: every schedule of the caller's tenant with its next
// and last firings, and pause/resume buttons (planex.v1.ScheduleService,
// docs/schedules.md).

import { callService } from './connect.js';
import { h, enumName, words, badge, time, announce } from './ui.js';

const service = 'planex.v1.ScheduleService';
const call = (method, req, signal) => callService(service, method, req, signal);

function specText(s) {
  s = s || {};
  let out = s.cron ? s.cron + (s.timeZone ? ' (' + s.timeZone + ')' : ' (UTC)') : 'every ' + (s.interval || '?') + (s.offset ? ' + ' + s.offset : '');
  if (s.jitter && s.jitter !== '0s') out += ', jitter ' + s.jitter;
  return out;
}

function firing(f) {
  const outcome = enumName(f.outcome, 'SCHEDULE_FIRING_OUTCOME_');
  return h('li', { dataset: { outcome } },
    time(f.nominalTime), ' ', badge(outcome === 'started' ? 'succeeded' : outcome === 'failed' ? 'failed' : 'pending', words(outcome)),
    f.runId ? [' ', h('a', { href: '#/runs/' + encodeURIComponent(f.runId), class: 'mono' }, f.runId)] : '',
    f.reason ? [' ', h('span', { class: 'muted' }, f.reason)] : '',
    f.backfill ? [' ', h('span', { class: 'muted' }, '(backfill)')] : '');
}

/**
 * schedulesPage renders the page into main and polls it; it returns the
 * page's teardown. showError(target, e) reports a call's error.
 */
export function schedulesPage(main, showError, poll) {
  document.title = 'Schedules · planex console';
  const err = h('p', { class: 'error', role: 'alert' });
  const list = h('div', { id: 'schedules' }, h('p', { class: 'muted' }, 'Loading…'));
  main.replaceChildren(h('h1', {}, 'Schedules'), err, list);
  const ctl = new AbortController();

  async function toggle(sc) {
    const method = sc.paused ? 'ResumeSchedule' : 'PauseSchedule';
    try {
      await call(method, { id: sc.id, note: sc.paused ? 'resumed from the console' : 'paused from the console' }, ctl.signal);
      announce(`Schedule ${sc.id} ${sc.paused ? 'resumed' : 'paused'}`);
      await load();
    } catch (e) { if (e.name !== 'AbortError') showError(err, e); }
  }

  function card(sc) {
    const next = sc.nextFirings || [];
    const recent = sc.recentFirings || [];
    const button = h('button', { type: 'button', dataset: { key: 'toggle-' + sc.id, action: sc.paused ? 'resume' : 'pause' }, onclick: () => toggle(sc) },
      sc.paused ? 'Resume' : 'Pause');
    return h('article', { class: 'panel', dataset: { schedule: sc.id } },
      h('h2', {}, h('span', { class: 'mono' }, sc.id), ' ', sc.paused ? badge('cancelled', 'paused') : badge('running', 'active'), ' ', button),
      sc.description ? h('p', {}, sc.description) : '',
      h('dl', { class: 'meta' },
        h('dt', {}, 'Goal'), h('dd', {}, (sc.action || {}).goal || '—'),
        h('dt', {}, 'When'), h('dd', { class: 'mono' }, specText(sc.spec)),
        h('dt', {}, 'Overlap'), h('dd', {}, words(enumName(sc.overlapPolicy, 'SCHEDULE_OVERLAP_POLICY_')) || 'skip'),
        h('dt', {}, 'Next'), h('dd', { class: 'next' }, next.length ? time(next[0]) : h('span', { class: 'muted' }, sc.paused ? 'paused' : '—')),
        h('dt', {}, 'Last'), h('dd', { class: 'last' }, recent.length ? h('ul', { class: 'plain' }, firing(recent[0])) : h('span', { class: 'muted' }, 'never fired')),
        sc.note ? [h('dt', {}, 'Note'), h('dd', {}, sc.note)] : '',
        (sc.runningRunIds || []).length ? [h('dt', {}, 'Running'), h('dd', {}, ...sc.runningRunIds.map((id) => h('a', { href: '#/runs/' + encodeURIComponent(id), class: 'mono' }, id + ' ')))] : ''),
      recent.length > 1 ? h('details', {}, h('summary', {}, `Recent firings (${recent.length})`), h('ul', { class: 'plain' }, ...recent.map(firing))) : '',
      next.length > 1 ? h('details', {}, h('summary', {}, 'Next firings'), h('ul', { class: 'plain' }, ...next.map((t) => h('li', {}, time(t))))) : '');
  }

  async function load() {
    try {
      const resp = await call('ListSchedules', {}, ctl.signal);
      const scs = resp.schedules || [];
      err.textContent = '';
      const key = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : undefined;
      list.replaceChildren(...(scs.length ? scs.map(card) : [h('p', { class: 'muted' }, 'No schedules. Create one with planex schedules create.')]));
      if (key) { const e = list.querySelector(`[data-key="${CSS.escape(key)}"]`); if (e) e.focus(); }
    } catch (e) { if (e.name !== 'AbortError') showError(err, e); }
  }

  const stop = poll(load, 5000);
  return () => { stop(); ctl.abort(); };
}
