package natsauth_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
)

// embeddedKey is a fresh user nkey pair.
func embeddedKey(t *testing.T) nkeys.KeyPair {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func publicKey(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// startEmbedded runs an embedded JetStream server authenticated by a
// natsauth.Embedded.
func startEmbedded(t *testing.T) (*server.Server, *natsauth.Embedded) {
	t.Helper()
	e := natsauth.NewEmbedded()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	e.Configure(opts)
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	e.Bind(s)
	return s, e
}

// connectKey connects presenting pub and signing the nonce with signer
// (the pair pub belongs to, or a forger's).
func connectKey(url, pub string, signer nkeys.KeyPair, errs chan<- error, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.Nkey(pub, signer.Sign),
		nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}),
	}, extra...)
	return nats.Connect(url, opts...)
}

// TestEmbeddedAdmitsOnlySignedKnownKeys: a known nkey whose signature
// verifies gets into its account with its identity's permissions; an
// unknown key, a known key signed by another pair, a password or no
// credentials at all are refused; a tenant's account added while the
// server runs has JetStream at once and shares nothing with $G.
func TestEmbeddedAdmitsOnlySignedKnownKeys(t *testing.T) {
	s, e := startEmbedded(t)
	url := s.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sup, exe, tenantSup, stranger := embeddedKey(t), embeddedKey(t), embeddedKey(t), embeddedKey(t)
	if err := e.SetAccount(natsauth.GlobalAccount, map[string]string{natsauth.Supervisor: publicKey(t, sup), "executor-sql": publicKey(t, exe)}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	nc, err := connectKey(url, publicKey(t, sup), sup, errs, nats.CustomInboxPrefix(bus.InboxPrefix(natsauth.Supervisor)))
	if err != nil {
		t.Fatalf("supervisor: %v", err)
	}
	defer nc.Close()
	res, err := bus.Setup(ctx, nc, bus.Options{Update: true})
	if err != nil {
		t.Fatalf("supervisor sets up JetStream in $G: %v", err)
	}
	if _, err := res.JS.Publish(ctx, bus.EventSubject("r1"), []byte("run log")); err != nil {
		t.Fatal(err)
	}

	for name, tc := range map[string]struct {
		opts []nats.Option
	}{
		"unknown key":              {[]nats.Option{nats.Nkey(publicKey(t, stranger), stranger.Sign)}},
		"known key, forged signer": {[]nats.Option{nats.Nkey(publicKey(t, sup), stranger.Sign)}},
		"password":                 {[]nats.Option{nats.UserInfo(natsauth.Supervisor, "x")}},
		"token":                    {[]nats.Option{nats.Token(publicKey(t, sup))}},
		"no credentials":           {nil},
	} {
		c, err := nats.Connect(url, append(tc.opts, nats.MaxReconnects(0))...)
		if err == nil {
			c.Close()
			t.Errorf("%s: connected, want refused", name)
		}
	}

	// The executor's permissions hold: it may not publish run log events.
	xerrs := make(chan error, 16)
	xc, err := connectKey(url, publicKey(t, exe), exe, xerrs, nats.CustomInboxPrefix(bus.InboxPrefix("executor-sql")))
	if err != nil {
		t.Fatalf("executor: %v", err)
	}
	defer xc.Close()
	if err := xc.Publish(bus.EventSubject("r1"), []byte("forged")); err != nil {
		t.Fatal(err)
	}
	waitViolation(t, xerrs, bus.EventSubject("r1"))

	// A tenant's account, added while the supervisor's connection is up.
	if err := e.SetAccount(natsauth.TenantAccount("a"), map[string]string{natsauth.Supervisor: publicKey(t, tenantSup)}); err != nil {
		t.Fatal(err)
	}
	tc, err := connectKey(url, publicKey(t, tenantSup), tenantSup, errs, nats.CustomInboxPrefix(bus.InboxPrefix(natsauth.Supervisor)))
	if err != nil {
		t.Fatalf("tenant a's supervisor: %v", err)
	}
	defer tc.Close()
	tres, err := bus.Setup(ctx, tc, bus.Options{Update: true})
	if err != nil {
		t.Fatalf("tenant a's supervisor sets up JetStream in its account: %v", err)
	}
	// Its own stream of the same name holds nothing of $G's.
	st, err := tres.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("tenant a's %s: %v msgs, %v; want its own, empty", bus.StreamEvents, info, err)
	}
	if nc.Stats().Reconnects != 0 {
		t.Errorf("$G's supervisor reconnected %d times while the tenant was added", nc.Stats().Reconnects)
	}

	// The same key cannot be given to a second account, and the refusal
	// creates nothing.
	if err := e.SetAccount(natsauth.TenantAccount("b"), map[string]string{natsauth.Supervisor: publicKey(t, tenantSup)}); err == nil {
		t.Error("SetAccount gave tenant a's key to tenant b")
	}
	if _, err := s.LookupAccount(natsauth.TenantAccount("b")); err == nil {
		t.Error("a refused SetAccount created tenant b's account")
	}
	if err := e.SetAccount(natsauth.TenantAccount("b"), map[string]string{"nobody": publicKey(t, stranger)}); err == nil {
		t.Error("SetAccount admitted an unknown identity")
	}
	if err := e.SetAccount(natsauth.TenantAccount("b"), map[string]string{natsauth.Supervisor: "not-a-key"}); err == nil {
		t.Error("SetAccount admitted a malformed public key")
	}
}

// TestEmbeddedAddsAccountsUnderJetStreamTraffic adds tenants' accounts
// while clients in other accounts make JetStream API calls without pause —
// what the dev stack does when a tenant is created. Under -race this is
// where a configuration reload raced inside nats-server (every service
// import's account rewritten while a JetStream request crossed one); adding
// accounts through Embedded must not, and every call keeps succeeding.
func TestEmbeddedAddsAccountsUnderJetStreamTraffic(t *testing.T) {
	s, e := startEmbedded(t)
	sup := embeddedKey(t)
	if err := e.SetAccount(natsauth.GlobalAccount, map[string]string{natsauth.Supervisor: publicKey(t, sup)}); err != nil {
		t.Fatal(err)
	}
	nc, err := connectKey(s.ClientURL(), publicKey(t, sup), sup, make(chan error, 1), nats.CustomInboxPrefix(bus.InboxPrefix(natsauth.Supervisor)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var calls atomic.Int64
	var wg sync.WaitGroup
	failed := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := js.AccountInfo(ctx); err != nil {
					failed <- err
					return
				}
				calls.Add(1)
			}
		}()
	}
	for i := range 8 {
		kp := embeddedKey(t)
		acct := natsauth.TenantAccount(fmt.Sprintf("t%d", i))
		if err := e.SetAccount(acct, map[string]string{natsauth.Supervisor: publicKey(t, kp)}); err != nil {
			t.Fatal(err)
		}
		c, err := connectKey(s.ClientURL(), publicKey(t, kp), kp, make(chan error, 1), nats.CustomInboxPrefix(bus.InboxPrefix(natsauth.Supervisor)))
		if err != nil {
			t.Fatalf("%s: %v", acct, err)
		}
		cjs, _ := jetstream.New(c)
		if _, err := cjs.AccountInfo(ctx); err != nil {
			t.Fatalf("%s has no JetStream: %v", acct, err)
		}
		c.Close()
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-failed:
		t.Fatalf("a JetStream call in $G failed while accounts were added: %v", err)
	default:
	}
	if calls.Load() == 0 {
		t.Fatal("no JetStream call ran beside the account additions")
	}
}
