// Small DOM and formatting helpers shared by the console's pages. Every
// value from the API is put into the page as text, never as markup.

/** h builds an element: h('a', {href: '#/x', class: 'c'}, 'text', child…). */
export function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) if (c !== undefined && c !== null && c !== false) e.append(c);
  return e;
}

export const enumName = (v, prefix) => (v || '').replace(prefix, '').toLowerCase().replace(/_/g, '-');
export const runStatus = (r) => enumName(r.status, 'RUN_STATUS_') || 'pending';
export const stepStatus = (s) => enumName(s.status, 'STEP_STATUS_') || 'pending';
export const words = (s) => s.replace(/-/g, ' ');
export const terminal = new Set(['succeeded', 'failed', 'escalated', 'cancelled']);

export function badge(status, label) {
  return h('span', { class: `badge s-${status}` }, label || words(status));
}

// Times are shown in the viewer's time zone and locale; the ISO value
// stays in the datetime attribute.
export const timeFmt = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
export const clockFmt = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
export function time(ts, fmt = timeFmt) {
  if (!ts) return h('span', { class: 'muted' }, '—');
  return h('time', { datetime: ts }, fmt.format(new Date(ts)));
}
export function json(v) { return h('pre', { tabindex: '0' }, JSON.stringify(v, null, 2)); }
export function duration(d) { return d ? d.replace(/^(\d+)\.(\d{0,3})\d*s$/, '$1.$2s') : '—'; }

export function announce(msg) { document.getElementById('announce').textContent = msg; }

/** left formats the time until ts: "4m 05s left", or "overdue by 12s". */
export function left(ts, now = Date.now()) {
  let s = Math.round((new Date(ts).getTime() - now) / 1000);
  const over = s < 0;
  s = Math.abs(s);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const pad = (n) => String(n).padStart(2, '0');
  const txt = d ? `${d}d ${hh}h ${pad(m)}m` : hh ? `${hh}h ${pad(m)}m ${pad(sec)}s` : `${m}m ${pad(sec)}s`;
  return over ? `overdue by ${txt}` : `${txt} left`;
}

/** hex turns protojson bytes (base64) into lower-case hex. */
export function hex(b64) {
  if (!b64) return '';
  try {
    return [...atob(b64)].map((c) => c.charCodeAt(0).toString(16).padStart(2, '0')).join('');
  } catch { return b64; }
}

/**
 * fieldError shows msg at input (aria-invalid, the error element its
 * aria-describedby names) and focuses it; an empty msg clears it.
 */
export function fieldError(input, errEl, msg) {
  errEl.textContent = msg || '';
  if (msg) { input.setAttribute('aria-invalid', 'true'); input.focus(); } else input.removeAttribute('aria-invalid');
}

let dialogs = 0;
/**
 * modal opens a native modal dialog titled title with body (elements) and
 * returns {el, close}. Escape and the close button close it; onClose runs
 * once it is closed. The dialog is removed from the page when closed.
 */
export function modal(title, body, onClose) {
  const id = 'dlg-' + (++dialogs);
  const dlg = h('dialog', { class: 'dialog', 'aria-labelledby': id + '-title', id },
    h('header', {}, h('h2', { id: id + '-title' }, title),
      h('button', { type: 'button', class: 'link close', 'aria-label': 'Close', onclick: () => dlg.close() }, 'Close')),
    body);
  dlg.addEventListener('close', () => { dlg.remove(); if (onClose) onClose(); });
  document.body.append(dlg);
  dlg.showModal();
  return { el: dlg, close: () => dlg.close() };
}
