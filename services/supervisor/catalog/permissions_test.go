package catalog

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// TestFloorsUnderGeneratedPermissions: under the generated NATS
// permissions the supervisor creates planex-tool-floors and records floors
// without a violation; an executor cannot write or read floors, cannot
// register another pool's tool, and a downgrade it writes under its own
// pool's key is refused by the supervisor.
func TestFloorsUnderGeneratedPermissions(t *testing.T) {
	t.Parallel()
	ctx := ctx(t)
	connectAs := natstest.Confined(t, "sql", "email")
	supErrs := make(chan error, 8)
	sup, err := bus.Setup(ctx, connectAs("supervisor", supErrs), bus.Options{Update: true})
	if err != nil {
		t.Fatalf("supervisor sets up JetStream: %v", err)
	}
	floors, err := sup.ToolFloorsBucket(ctx)
	if err != nil {
		t.Fatalf("supervisor creates %s: %v", bus.BucketToolFloors, err)
	}
	email, err := bus.Setup(ctx, connectAs("executor-email", make(chan error, 8)), bus.Options{})
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
	sqlNC := connectAs("executor-sql", sqlErrs)
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
