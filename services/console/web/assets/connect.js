// A minimal client of the Connect protocol (JSON codec) for
// planex.v1.SupervisorService, served by the console from the generated
// handlers. Unary calls are POSTs of protojson; server streams are
// enveloped protojson messages (1 flag byte, 4 length bytes) ending with an
// end-of-stream envelope (flag 2) that may carry an error.
//
// A call is authenticated by the pasted bearer token (Authorization) when
// there is one, else by the single sign-on session: the browser sends the
// session cookie (same-origin) and the page the session's CSRF token.

import { authState, ssoSignedIn, forget } from './sso.js';

const base = '/planex.v1.SupervisorService/';
const tokenKey = 'planex.console.token';

/** RPCError is a Connect error: code is a Connect code name ("unauthenticated"). */
export class RPCError extends Error {
  constructor(code, message) {
    super(message || code);
    this.code = code || 'unknown';
  }
}

export function token() { return sessionStorage.getItem(tokenKey) || ''; }
export function setToken(t) {
  if (t) sessionStorage.setItem(tokenKey, t); else sessionStorage.removeItem(tokenKey);
}

/** signedIn says whether calls carry a bearer token or an SSO session. */
export function signedIn() { return !!token() || ssoSignedIn(); }

async function headers(contentType) {
  const h = { 'Content-Type': contentType, 'Connect-Protocol-Version': '1' };
  const t = token();
  if (t) {
    h.Authorization = 'Bearer ' + t;
  } else {
    const st = await authState();
    if (st.signedIn) h['X-CSRF-Token'] = st.csrfToken;
  }
  return h;
}

const httpCodes = { 400: 'invalid_argument', 401: 'unauthenticated', 403: 'permission_denied', 404: 'not_found', 408: 'deadline_exceeded', 409: 'aborted', 412: 'failed_precondition', 429: 'resource_exhausted', 501: 'unimplemented', 503: 'unavailable' };

async function post(method, contentType, body, signal) {
  try {
    return await fetch(base + method, { method: 'POST', headers: await headers(contentType), body, signal, cache: 'no-store', credentials: 'same-origin' });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new RPCError('unavailable', 'The console is unreachable: ' + e.message);
  }
}

async function errorOf(resp) {
  let body = {};
  try { body = await resp.json(); } catch { /* not JSON */ }
  if (resp.status === 401) forget(); // the SSO session may have ended
  return new RPCError(body.code || httpCodes[resp.status] || 'unknown', body.message || resp.statusText);
}

/** call makes a unary call and returns the response message (protojson). */
export async function call(method, request, signal) {
  const resp = await post(method, 'application/json', JSON.stringify(request || {}), signal);
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

/** stream makes a server-streaming call and yields each response message. */
export async function* stream(method, request, signal) {
  const payload = new TextEncoder().encode(JSON.stringify(request || {}));
  const env = new Uint8Array(5 + payload.length);
  new DataView(env.buffer).setUint32(1, payload.length);
  env.set(payload, 5);
  const resp = await post(method, 'application/connect+json', env, signal);
  if (!resp.ok) throw await errorOf(resp);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = new Uint8Array(0);
  for (;;) {
    while (buf.length >= 5) {
      const flags = buf[0];
      const len = new DataView(buf.buffer, buf.byteOffset, buf.length).getUint32(1);
      if (buf.length < 5 + len) break;
      const msg = JSON.parse(decoder.decode(buf.subarray(5, 5 + len)) || '{}');
      buf = buf.slice(5 + len);
      if (flags & 2) {
        if (msg.error) throw new RPCError(msg.error.code, msg.error.message);
        return;
      }
      yield msg;
    }
    const { done, value } = await reader.read();
    if (done) throw new RPCError('unavailable', 'the event stream ended early');
    const next = new Uint8Array(buf.length + value.length);
    next.set(buf);
    next.set(value, buf.length);
    buf = next;
  }
}

/** callService makes a unary call of another planex service the console serves (e.g. planex.v1.ScheduleService). */
export async function callService(service, method, request, signal) {
  const resp = await post('../' + service + '/' + method, 'application/json', JSON.stringify(request || {}), signal);
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}
