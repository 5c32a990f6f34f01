package natsauth

import (
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// GlobalAccount names the embedded server's global account ($G) in
// Embedded.SetAccount: the default tenant's, in a server without a
// DefaultAccount.
const GlobalAccount = "$G"

// Embedded authenticates the clients of an embedded nats-server whose
// accounts and users change while it runs (the dev stack's, as tenants are
// created): it is the server's CustomClientAuthentication and keeps, per
// public nkey, the account the user is in and its ForService permissions.
// An account and its users are added with SetAccount — no configuration
// reload. A reload of a server with live JetStream traffic races inside
// nats-server (2.15): configureAccounts rewrites the account of every
// service import, JetStream's API import included, while clients crossing
// one read it (client.setupResponseServiceImport); the race detector
// catches it. A stock nats-server (Kubernetes) is still given a file
// (ServerConfigWithOptions) and reloaded by the reloader sidecar.
//
// A client is admitted only with a known public nkey whose signature of
// the server's nonce verifies; everything else is refused, routes,
// gateways and leaf nodes included (an embedded dev server has none).
type Embedded struct {
	mu    sync.RWMutex
	srv   *server.Server
	users map[string]embeddedUser // public nkey → user
}

type embeddedUser struct {
	identity string
	account  string
	perms    *server.Permissions
}

// NewEmbedded returns an authenticator with no users.
func NewEmbedded() *Embedded {
	return &Embedded{users: map[string]embeddedUser{}}
}

// Configure makes opts authenticate through e: every client presents an
// nkey signature of a nonce (AlwaysEnableNonce), and the users, nkeys and
// accounts of opts are cleared (e holds them).
func (e *Embedded) Configure(opts *server.Options) {
	opts.CustomClientAuthentication = e
	opts.AlwaysEnableNonce = true
	opts.Nkeys, opts.Users, opts.Accounts = nil, nil, nil
}

// Bind gives e the server started from options Configure changed; the
// server must be ready for connections (SetAccount creates accounts in
// it and turns their JetStream on).
func (e *Embedded) Bind(s *server.Server) {
	e.mu.Lock()
	e.srv = s
	e.mu.Unlock()
}

// SetAccount makes account exist with JetStream (GlobalAccount: the
// server's global account) and admits users, identity → public nkey, in
// it with the identity's ForService permissions. Users given earlier stay;
// a public nkey already in another account is refused, naming both.
func (e *Embedded) SetAccount(account string, users map[string]string) error {
	e.mu.RLock()
	s := e.srv
	e.mu.RUnlock()
	if s == nil {
		return errors.New("natsauth: embedded server not bound (Embedded.Bind)")
	}
	if account == "" {
		return errors.New("natsauth: account: empty")
	}
	add := make(map[string]embeddedUser, len(users))
	for id, pub := range users {
		if !nkeys.IsValidPublicUserKey(pub) {
			return fmt.Errorf("natsauth: account %s: identity %s: %q is not a public user nkey", account, id, pub)
		}
		p, err := ForService(id)
		if err != nil {
			return fmt.Errorf("natsauth: account %s: %w", account, err)
		}
		add[pub] = embeddedUser{identity: id, account: account, perms: p.Server()}
	}
	// Refused before the account is touched: nothing is half done.
	e.mu.RLock()
	err := e.conflict(account, add)
	e.mu.RUnlock()
	if err != nil {
		return err
	}
	if account == GlobalAccount {
		if err := EnableGlobalJetStream(s); err != nil {
			return err
		}
	} else {
		acc, _ := s.LookupOrRegisterAccount(account)
		if !acc.JetStreamEnabled() {
			if err := acc.EnableJetStream(nil, nil); err != nil {
				return fmt.Errorf("natsauth: account %s: enable JetStream: %w", account, err)
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.conflict(account, add); err != nil {
		return err
	}
	maps.Copy(e.users, add)
	return nil
}

// conflict refuses users whose public nkey is already admitted in another
// account. e.mu is held.
func (e *Embedded) conflict(account string, users map[string]embeddedUser) error {
	for pub, u := range users {
		if old, ok := e.users[pub]; ok && old.account != account {
			return fmt.Errorf("natsauth: identity %s of account %s has the public nkey of %s in account %s", u.identity, account, old.identity, old.account)
		}
	}
	return nil
}

// Check implements server.Authentication: a client connection whose nkey
// is known and whose signature of the nonce verifies is put in its
// account with its permissions.
func (e *Embedded) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	o := c.GetOpts()
	if o == nil || o.Nkey == "" || o.Sig == "" || len(c.GetNonce()) == 0 {
		return false
	}
	e.mu.RLock()
	u, ok := e.users[o.Nkey]
	s := e.srv
	e.mu.RUnlock()
	if !ok || s == nil {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(o.Sig)
	if err != nil {
		// Allow the standard encoding too, as nats-server does.
		if sig, err = base64.StdEncoding.DecodeString(o.Sig); err != nil {
			return false
		}
	}
	pub, err := nkeys.FromPublicKey(o.Nkey)
	if err != nil || pub.Verify(c.GetNonce(), sig) != nil {
		return false
	}
	var acc *server.Account
	if u.account == GlobalAccount {
		acc = s.GlobalAccount()
	} else if acc, err = s.LookupAccount(u.account); err != nil {
		return false
	}
	c.RegisterUser(&server.User{Username: o.Nkey, Permissions: u.perms, Account: acc})
	return true
}
