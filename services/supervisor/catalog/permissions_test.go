package catalog

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
)

// startConfined runs an embedded JetStream server with one user per planex
// identity (password = name + "-pw") holding its natsauth.ForService
// permissions, the grants the dev stack and `planex auth k8s-secrets`
// generate.
func startConfined(t *testing.T) string {
	t.Helper()
	var users []*server.User
	for _, svc := range natsauth.Services("sql", "email") {
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
	return s.ClientURL()
}

// connectAs connects as identity svc (named planex-<svc>, as bus.Connect
// does: bus.Setup opens what that identity may); permission violations go
// to errs.
func connectAs(t *testing.T, url, svc string, errs chan<- error) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(svc, svc+"-pw"), nats.Name("planex-"+svc), nats.CustomInboxPrefix(bus.InboxPrefix(svc)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
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

// TestFloorsUnderGeneratedPermissions: under the generated NATS
// permissions the supervisor creates planex-tool-floors and records floors
// without a violation; an executor cannot write or read floors, cannot
// register another pool's tool, and a downgrade it writes under its own
// pool's key is refused by the supervisor.
func TestFloorsUnderGeneratedPermissions(t *testing.T) {
	t.Parallel()
	ctx := ctx(t)
	url := startConfined(t)
	supErrs := make(chan error, 8)
	sup, err := bus.Setup(ctx, connectAs(t, url, "supervisor", supErrs), bus.Options{Update: true})
	if err != nil {
		t.Fatalf("supervisor sets up JetStream: %v", err)
	}
	floors, err := sup.ToolFloorsBucket(ctx)
	if err != nil {
		t.Fatalf("supervisor creates %s: %v", bus.BucketToolFloors, err)
	}
	email, err := bus.Setup(ctx, connectAs(t, url, "executor-email", make(chan error, 8)), bus.Options{})
	if err != nil {
		t.Fatalf("executor-email sets up JetStream: %v", err)
	}
	spec, _ := proto.Marshal(draft())
	if _, err := email.Tools.Put(ctx, "email.draft.r1", spec); err != nil {
		t.Fatalf("executor-email registers its tool: %v", err)
	}
	logs := &syncBuffer{}
	c := NewCache(sup.Tools, newTextLogger(logs), time.Nanosecond, Trust{Floors: floors})
	if _, err := c.Fresh(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := floors.Get(ctx, "email.draft"); err != nil || !strings.Contains(string(e.Value()), `"SIDE_EFFECT_WRITE"`) {
		t.Fatalf("recorded floor: %v %v", e, err)
	}
	select {
	case err := <-supErrs:
		t.Fatalf("the supervisor's floor writes violate its permissions: %v", err)
	default:
	}

	// executor-sql: no floor, and no other pool's registration.
	sqlErrs := make(chan error, 8)
	sqlNC := connectAs(t, url, "executor-sql", sqlErrs)
	js, err := jetstream.New(sqlNC)
	if err != nil {
		t.Fatal(err)
	}
	for _, forbidden := range []string{"$KV." + bus.BucketToolFloors + ".email.draft", "$KV." + bus.BucketTools + ".email.draft.x"} {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := js.Publish(pctx, forbidden, spec)
		cancel()
		if err == nil {
			t.Errorf("executor-sql published to %s", forbidden)
		}
	}
	kctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := js.KeyValue(kctx, bus.BucketToolFloors); err == nil {
		t.Error("executor-sql opened the floors bucket")
	}

	// executor-email may write its own pool's keys: its downgrade is
	// refused by the supervisor, which keeps serving the floor.
	f := draft()
	f.SideEffect, f.SensitiveFields = planexv1.SideEffect_SIDE_EFFECT_READ, nil
	low, _ := proto.Marshal(f)
	if _, err := email.Tools.Put(ctx, "email.draft.evil", low); err != nil {
		t.Fatal(err)
	}
	if err := email.Tools.Delete(ctx, "email.draft.r1"); err != nil {
		t.Fatal(err)
	}
	cat, err := c.Fresh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkServed(t, cat, "email.draft", FloorOf(draft()))
	if !strings.Contains(logs.String(), "reason=downgrade") {
		t.Fatalf("no downgrade refusal logged:\n%s", logs.String())
	}
}
