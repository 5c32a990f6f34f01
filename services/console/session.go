package console

import (
	"sync"
	"time"
)

// session is one browser's single sign-on session, held in memory only:
// its tokens never reach the browser, which holds the random id in the
// session cookie. mu serialises refreshes.
type session struct {
	id, csrf string // immutable

	mu                   sync.Mutex
	subject, name, email string
	roles                []string
	idToken, accessToken string
	refreshToken         string
	forward, forwardKind string    // the token sent to the supervisor: "access" or "id"
	expiry               time.Time // of forward
	idExpiry             time.Time
	issued, created      time.Time // forward's arrival; sign-in
}

// sessionView is a copy of a session's fields taken under its lock.
type sessionView struct {
	csrf, subject, name, email, forward, forwardKind string
	roles                                            []string
	expiry                                           time.Time
}

// view copies the fields (sess.mu held).
func (s *session) view() sessionView {
	return sessionView{csrf: s.csrf, subject: s.subject, name: s.name, email: s.email, forward: s.forward,
		forwardKind: s.forwardKind, roles: append([]string(nil), s.roles...), expiry: s.expiry}
}

// sessionStore holds the sessions by id, at most max (the oldest go
// first); ended sessions are dropped whenever one is added.
type sessionStore struct {
	mu  sync.Mutex
	m   map[string]*session
	max int
}

func newSessionStore(max int) *sessionStore {
	return &sessionStore{m: map[string]*session{}, max: max}
}

func (st *sessionStore) get(id string) *session {
	if id == "" {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.m[id]
}

func (st *sessionStore) remove(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.m, id)
}

func (st *sessionStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.m)
}

// put adds sess, first dropping sessions past maxAge or whose token
// expired with no refresh token, then the oldest beyond max.
func (st *sessionStore) put(sess *session, now time.Time, maxAge time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, s := range st.m {
		if !s.mu.TryLock() {
			continue // being refreshed: alive
		}
		dead := now.After(s.created.Add(maxAge)) || (s.refreshToken == "" && now.After(s.expiry))
		s.mu.Unlock()
		if dead {
			delete(st.m, id)
		}
	}
	for len(st.m) >= st.max {
		var oldest *session
		for _, s := range st.m {
			if oldest == nil || s.created.Before(oldest.created) {
				oldest = s
			}
		}
		delete(st.m, oldest.id)
	}
	st.m[sess.id] = sess
}
