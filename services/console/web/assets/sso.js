// Single sign-on for the page. /auth/me says whether the console signs
// browsers in through an OpenID Connect provider and who is signed in. The
// tokens stay on the console: the page holds only the HttpOnly session
// cookie (sent by the browser) and the session's CSRF token, which
// connect.js sends as X-CSRF-Token on every API call.

const signedOut = { sso: null, signedIn: false };
let pending = null; // promise of the last /auth/me
let last = signedOut;

/** authState fetches /auth/me once (again with refetch) and resolves to it. */
export function authState(refetch) {
  if (!pending || refetch) {
    pending = fetch('/auth/me', { credentials: 'same-origin', cache: 'no-store' })
      .then((r) => (r.ok ? r.json() : signedOut))
      .catch(() => signedOut)
      .then((st) => {
        last = st || signedOut;
        const out = document.getElementById('signout');
        if (out && last.signedIn) {
          out.hidden = false;
          out.title = `Signed in as ${last.name || last.subject}` + (last.roles && last.roles.length ? ` (${last.roles.join(', ')})` : '');
          out.dataset.user = last.subject || '';
        }
        return last;
      });
  }
  return pending;
}

/** ssoSignedIn says whether the last /auth/me had a signed-in session. */
export function ssoSignedIn() { return !!last.signedIn; }

/** forget drops the known state: the next call asks /auth/me again. */
export function forget() { pending = null; last = signedOut; }

/** startSignIn sends the browser to the provider; back on route next. */
export function startSignIn(next) {
  location.assign('/auth/login' + (next && next.startsWith('#/') ? '?next=' + encodeURIComponent(next) : ''));
}

/**
 * signOut ends the session at the console and resolves to the provider's
 * end_session URL ('' when it has none), where the browser should go next.
 */
export async function signOut() {
  const st = await authState();
  if (!st.signedIn) return '';
  let body = {};
  try {
    const resp = await fetch('/auth/logout', { method: 'POST', credentials: 'same-origin', cache: 'no-store', headers: { 'X-CSRF-Token': st.csrfToken || '' } });
    body = await resp.json();
  } catch { /* the session is gone either way once the console answers */ }
  forget();
  return body.endSessionURL || '';
}
