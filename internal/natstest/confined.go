package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
)

// Confined starts an embedded JetStream server whose users are planex's
// NATS identities for pools (natsauth.Services; password: the name +
// "-pw"), each holding its natsauth.ForService permissions — the grants
// the dev stack and `planex auth k8s-secrets` generate. The returned
// function connects as one identity the way bus.Connect does (client name
// planex-<identity>, so bus.Setup opens what that identity may; its own
// inbox prefix) and sends the connection's async errors, the server's
// permission violations among them, to errs (dropped when errs is full).
func Confined(t testing.TB, pools ...string) func(identity string, errs chan<- error) *nats.Conn {
	t.Helper()
	var users []*server.User
	for _, svc := range natsauth.Services(pools...) {
		p, err := natsauth.ForService(svc)
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, &server.User{Username: svc, Password: svc + "-pw", Permissions: p.Server()})
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	return func(identity string, errs chan<- error) *nats.Conn {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(identity, identity+"-pw"), nats.Name("planex-"+identity),
			nats.CustomInboxPrefix(bus.InboxPrefix(identity)), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case errs <- err:
				default:
				}
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}
