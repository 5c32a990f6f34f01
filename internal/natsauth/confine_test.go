package natsauth_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// confined is a server configured from the generated permissions with the
// supervisor's resources and the email pool's data in place: a tool
// registration, an effect record and a stored output of the email pool,
// a run result the supervisor stored, and an effect record of the layout
// before pools.
type confined struct {
	url      string
	sup      *bus.Resources
	emailRef *planexv1.OutputRef
	supRef   *planexv1.OutputRef
}

func setupConfined(ctx context.Context, t *testing.T) *confined {
	t.Helper()
	c := &confined{url: startServer(t)}
	var err error
	supErrs := make(chan error, 8)
	c.sup, err = bus.Setup(ctx, connect(t, c.url, "supervisor", supErrs), bus.Options{Update: true})
	if err != nil {
		t.Fatalf("supervisor sets up JetStream: %v", err)
	}
	emailErrs := make(chan error, 8)
	email, err := bus.Setup(ctx, connect(t, c.url, "executor-email", emailErrs), bus.Options{})
	if err != nil {
		t.Fatalf("executor-email sets up JetStream: %v", err)
	}
	if email.OutputsBucket != bus.OutputBucket("email") || email.Drafts == nil || email.Runs != nil {
		t.Fatalf("executor-email opened outputs %q, drafts %v, runs %v: want its own output bucket and drafts, no run snapshots",
			email.OutputsBucket, email.Drafts != nil, email.Runs != nil)
	}
	spec, _ := proto.Marshal(&planexv1.ToolSpec{Name: "email.draft", Pool: "email", SideEffect: planexv1.SideEffect_SIDE_EFFECT_WRITE})
	if _, err := email.Tools.Put(ctx, "email.draft.r1", spec); err != nil {
		t.Fatalf("executor-email registers its tool: %v", err)
	}
	if _, err := email.Effects.Create(ctx, bus.PoolEffectKey("email", bus.EffectKey("RUNE", "send", 1)), []byte("sent")); err != nil {
		t.Fatalf("executor-email records an effect: %v", err)
	}
	name, err := bus.PutOutputOnce(ctx, email.Outputs, bus.OutputName("RUNE", "read", 1), []byte(`{"to":"ceo@example.com"}`))
	if err != nil {
		t.Fatalf("executor-email stores an output: %v", err)
	}
	c.emailRef = &planexv1.OutputRef{Bucket: email.OutputsBucket, Name: name}
	if _, err := c.sup.Outputs.PutBytes(ctx, bus.OutputName("RUNS", "result", 0), []byte(`"the answer"`)); err != nil {
		t.Fatal(err)
	}
	c.supRef = &planexv1.OutputRef{Bucket: bus.ObjectOutputs, Name: bus.OutputName("RUNS", "result", 0)}
	if _, err := c.sup.Effects.Create(ctx, bus.EffectKey("RUNOLD", "send", 1), []byte("legacy")); err != nil {
		t.Fatal(err)
	}
	// The run index's checkpoint: created, written and read back within
	// the supervisor's grants.
	idx, err := c.sup.RunIndexBucket(ctx)
	if err != nil {
		t.Fatalf("supervisor creates %s: %v", bus.ObjectRunIndex, err)
	}
	if _, err := idx.PutBytes(ctx, "runs", []byte("checkpoint")); err != nil {
		t.Fatalf("supervisor writes its run index checkpoint: %v", err)
	}
	if b, err := idx.GetBytes(ctx, "runs"); err != nil || string(b) != "checkpoint" {
		t.Fatalf("supervisor reads its run index checkpoint: %q, %v", b, err)
	}
	assertNoAsyncError(t, emailErrs)
	assertNoAsyncError(t, supErrs)
	return c
}

// assertNoAsyncError fails when errs holds an error (a permissions
// violation is reported to the connection's error handler).
func assertNoAsyncError(t *testing.T, errs <-chan error) {
	t.Helper()
	select {
	case err := <-errs:
		t.Fatalf("async error on a connection that stayed within its grants: %v", err)
	default:
	}
}

// TestExecutorWritesOnlyItsOwnPoolsKeys reproduces issue 26's high finding
// and the effects and output ones, against a server configured from the
// generated permissions: executor-sql cannot register a tool of the email
// pool ($KV.planex-tools.email.draft.x), write or read the email pool's
// effect records, write records of the layout before pools, read or purge
// any output bucket but write its own, nor purge, delete or update
// streams; and a roll-up on a key it may write purges nothing.
func TestExecutorWritesOnlyItsOwnPoolsKeys(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := setupConfined(ctx, t)

	// Within its grants: no error at all.
	okErrs := make(chan error, 8)
	res, err := bus.Setup(ctx, connect(t, c.url, "executor-sql", okErrs), bus.Options{})
	if err != nil {
		t.Fatalf("executor-sql sets up JetStream: %v", err)
	}
	if res.OutputsBucket != bus.OutputBucket("sql") || res.Drafts != nil || res.Idempotency != nil {
		t.Fatalf("executor-sql opened outputs %q, drafts %v, idempotency %v: want %s only", res.OutputsBucket, res.Drafts != nil, res.Idempotency != nil, bus.OutputBucket("sql"))
	}
	if _, err := res.Tools.Put(ctx, "sql.query.r1", []byte("{}")); err != nil {
		t.Fatalf("executor-sql registers its tool: %v", err)
	}
	own := bus.PoolEffectKey("sql", bus.EffectKey("RUNQ", "write", 1))
	if _, err := res.Effects.Create(ctx, own, []byte("started")); err != nil {
		t.Fatalf("executor-sql records its effect: %v", err)
	}
	if e, err := res.Effects.Get(ctx, own); err != nil || string(e.Value()) != "started" {
		t.Fatalf("executor-sql reads its effect record: %v", err)
	}
	if e, err := res.Effects.Get(ctx, bus.EffectKey("RUNOLD", "send", 1)); err != nil || string(e.Value()) != "legacy" {
		t.Fatalf("executor-sql reads a record of the layout before pools: %v", err)
	}
	big := bytes.Repeat([]byte("x"), 300<<10) // several chunks
	name, err := bus.PutOutputOnce(ctx, res.Outputs, bus.OutputName("RUNQ", "q", 1), big)
	if err != nil {
		t.Fatalf("executor-sql stores a large output: %v", err)
	}
	if again, err := bus.PutOutputOnce(ctx, res.Outputs, bus.OutputName("RUNQ", "q", 1), big); err != nil || again != name {
		t.Fatalf("storing the same output again: %q, %v; want the object %q reused", again, err, name)
	}
	other, err := bus.PutOutputOnce(ctx, res.Outputs, bus.OutputName("RUNQ", "q", 1), []byte("other bytes"))
	if err != nil || other == name || !strings.HasPrefix(other, name+"/") {
		t.Fatalf("storing another output of the same attempt: %q, %v; want a distinct name under %s/", other, err, name)
	}
	for n, want := range map[string][]byte{name: big, other: []byte("other bytes")} {
		got, err := c.sup.ReadOutput(ctx, &planexv1.OutputRef{Bucket: res.OutputsBucket, Name: n, Size: int64(len(want))})
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("supervisor reads %s/%s: %d bytes, %v", res.OutputsBucket, n, len(got), err)
		}
	}
	assertNoAsyncError(t, okErrs)

	// Beyond its grants: refused, and nothing changed.
	errs := make(chan error, 64)
	nc := connect(t, c.url, "executor-sql", errs)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	poisoned, _ := proto.Marshal(&planexv1.ToolSpec{Name: "email.draft", Pool: "email", SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ})
	meta := "$O." + bus.OutputBucket("email") + ".M." + base64.URLEncoding.EncodeToString([]byte(c.emailRef.GetName()))
	for _, tc := range []struct {
		name, subject string
		data          []byte
		header        nats.Header
	}{
		{"register a tool of another pool", "$KV.planex-tools.email.draft.x", poisoned, nil},
		{"overwrite another pool's registration", "$KV.planex-tools.email.draft.r1", poisoned, nil},
		{"write another pool's effect record", "$KV.planex-effects.email.RUNE.send.1", []byte("finished"), nil},
		{"write a record of the layout before pools", "$KV.planex-effects.RUNE.send.2", []byte("finished"), nil},
		{"read another pool's effect record", "$JS.API.DIRECT.GET.KV_planex-effects.$KV.planex-effects.email.RUNE.send.1", nil, nil},
		{"read another pool's registrations", "$JS.API.DIRECT.GET.KV_planex-tools.$KV.planex-tools.email.draft.r1", nil, nil},
		{"direct get by request body", "$JS.API.DIRECT.GET.KV_planex-effects", []byte(`{"last_by_subj":"$KV.planex-effects.email.RUNE.send.1"}`), nil},
		{"purge the shared outputs", "$JS.API.STREAM.PURGE.OBJ_planex-outputs", []byte(`{}`), nil},
		{"purge another pool's outputs", "$JS.API.STREAM.PURGE.OBJ_" + bus.OutputBucket("email"), []byte(`{}`), nil},
		{"purge its own outputs", "$JS.API.STREAM.PURGE.OBJ_" + bus.OutputBucket("sql"), []byte(`{}`), nil},
		{"read another run's output (msg get)", "$JS.API.STREAM.MSG.GET.OBJ_" + bus.OutputBucket("email"), []byte(`{"last_by_subj":"` + meta + `"}`), nil},
		{"read another run's output (direct get)", "$JS.API.DIRECT.GET.OBJ_" + bus.OutputBucket("email") + "." + meta, nil, nil},
		{"read the supervisor's stored results", "$JS.API.STREAM.MSG.GET.OBJ_planex-outputs", []byte(`{"seq":1}`), nil},
		{"write another pool's outputs", "$O." + bus.OutputBucket("email") + ".M.x", []byte(`{}`), nil},
		{"create another pool's output bucket", "$JS.API.STREAM.CREATE.OBJ_" + bus.OutputBucket("search"), []byte(`{}`), nil},
		{"purge the effect records", "$JS.API.STREAM.PURGE.KV_planex-effects", []byte(`{}`), nil},
		{"delete the tool catalog", "$JS.API.STREAM.DELETE.KV_planex-tools", nil, nil},
		{"delete a message of the catalog", "$JS.API.STREAM.MSG.DELETE.KV_planex-tools", []byte(`{"seq":1}`), nil},
		{"update the steps stream", "$JS.API.STREAM.UPDATE.PLANEX_STEPS", []byte(`{"name":"PLANEX_STEPS","subjects":["planex.steps.>"]}`), nil},
		{"delete another pool's consumer", "$JS.API.CONSUMER.DELETE.PLANEX_STEPS.pool-email", nil, nil},
		{"create its consumer with another pool's filter", "$JS.API.CONSUMER.CREATE.PLANEX_STEPS.pool-sql.planex.steps.email.>",
			[]byte(`{"stream_name":"PLANEX_STEPS","config":{"durable_name":"pool-sql","filter_subject":"planex.steps.email.>","ack_policy":"explicit"}}`), nil},
		{"create its consumer without a filter in the subject", "$JS.API.CONSUMER.CREATE.PLANEX_STEPS.pool-sql",
			[]byte(`{"stream_name":"PLANEX_STEPS","config":{"durable_name":"pool-sql","filter_subject":"planex.steps.email.>","ack_policy":"explicit"}}`), nil},
		{"read run snapshots", "$JS.API.STREAM.INFO.KV_planex-runs", nil, nil},
	} {
		msg := &nats.Msg{Subject: tc.subject, Data: tc.data, Header: tc.header}
		if _, err := nc.RequestMsg(msg, 500*time.Millisecond); err == nil {
			t.Errorf("executor-sql could %s (%s): the server answered", tc.name, tc.subject)
			continue
		}
		waitViolation(t, errs, tc.subject)
	}

	// The catalog still holds the email pool's own registration, and no
	// poisoned one.
	if _, err := c.sup.Tools.Get(ctx, "email.draft.x"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("planex-tools key email.draft.x: %v, want not found", err)
	}
	if e, err := c.sup.Tools.Get(ctx, "email.draft.r1"); err != nil {
		t.Errorf("email.draft.r1: %v", err)
	} else if got := (&planexv1.ToolSpec{}); proto.Unmarshal(e.Value(), got) != nil || got.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_WRITE {
		t.Errorf("email.draft.r1 now registers %v, want the email pool's WRITE spec", got)
	}
	if e, err := c.sup.Effects.Get(ctx, bus.PoolEffectKey("email", bus.EffectKey("RUNE", "send", 1))); err != nil || string(e.Value()) != "sent" {
		t.Errorf("the email pool's effect record: %v", err)
	}
	for _, ref := range []*planexv1.OutputRef{c.emailRef, c.supRef, {Bucket: res.OutputsBucket, Name: name}} {
		if _, err := c.sup.ReadOutput(ctx, ref); err != nil {
			t.Errorf("output %s/%s after the refused purges: %v", ref.GetBucket(), ref.GetName(), err)
		}
	}
	for _, s := range []string{bus.StreamSteps, "KV_" + bus.BucketTools, "KV_" + bus.BucketEffects} {
		if _, err := c.sup.JS.Stream(ctx, s); err != nil {
			t.Errorf("stream %s after the refused deletes: %v", s, err)
		}
	}

	// A roll-up on a key it may write would purge the whole bucket: the
	// buckets refuse roll-ups.
	for _, subject := range []string{"$KV.planex-tools.sql.query.r1", "$KV.planex-effects." + own} {
		m := nats.NewMsg(subject)
		m.Header.Set("Nats-Rollup", "all")
		m.Data = []byte("{}")
		if _, err := js.PublishMsg(ctx, m); err == nil {
			t.Errorf("a roll-up on %s was accepted", subject)
		}
	}
	if _, err := c.sup.Tools.Get(ctx, "email.draft.r1"); err != nil {
		t.Errorf("email.draft.r1 after the refused roll-up: %v", err)
	}
	if _, err := c.sup.Effects.Get(ctx, bus.PoolEffectKey("email", bus.EffectKey("RUNE", "send", 1))); err != nil {
		t.Errorf("the email pool's effect record after the refused roll-up: %v", err)
	}
}

// TestSupervisorReadsOnlyOutputBuckets: the supervisor reads an output
// from the bucket its reference names when that is planex-outputs or a
// pool's bucket, refuses any other bucket, an object that does not match
// the reference, and (CheckStepOutputRef) a step result naming another
// pool's bucket or another attempt's object.
func TestSupervisorReadsOnlyOutputBuckets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := setupConfined(ctx, t)
	for _, ref := range []*planexv1.OutputRef{c.emailRef, c.supRef} {
		if _, err := c.sup.ReadOutput(ctx, ref); err != nil {
			t.Errorf("read %s/%s: %v", ref.GetBucket(), ref.GetName(), err)
		}
	}
	if _, err := c.sup.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "secrets"}); err != nil {
		t.Fatal(err)
	}
	for _, bucket := range []string{"KV_planex-runs", "planex-runs", "secrets", "planex-outputs-", "planex-outputs-a.b", "planex-outputsx", ""} {
		_, err := c.sup.ReadOutput(ctx, &planexv1.OutputRef{Bucket: bucket, Name: "x"})
		if !errors.Is(err, bus.ErrOutputBucket) || !strings.Contains(err.Error(), `"`+bucket+`"`) {
			t.Errorf("bucket %q: %v, want ErrOutputBucket naming it", bucket, err)
		}
	}
	if _, err := c.sup.ReadOutput(ctx, &planexv1.OutputRef{Bucket: c.emailRef.GetBucket(), Name: c.emailRef.GetName(), Sha256: strings.Repeat("0", 64)}); !errors.Is(err, bus.ErrOutputMismatch) {
		t.Errorf("an object that does not match its reference's SHA-256: %v, want ErrOutputMismatch", err)
	}
	for _, tc := range []struct {
		ref  *planexv1.OutputRef
		want error
	}{
		{&planexv1.OutputRef{Bucket: bus.OutputBucket("sql"), Name: "RUNQ/q/1"}, nil},
		{&planexv1.OutputRef{Bucket: bus.OutputBucket("sql"), Name: "RUNQ/q/1/ABC"}, nil},
		{&planexv1.OutputRef{Bucket: bus.ObjectOutputs, Name: "RUNQ/q/1"}, nil},
		{&planexv1.OutputRef{Bucket: bus.OutputBucket("email"), Name: "RUNQ/q/1"}, bus.ErrOutputBucket},
		{&planexv1.OutputRef{Bucket: bus.ObjectOutputs, Name: "RUNS/result/0"}, bus.ErrOutputForeign},
		{&planexv1.OutputRef{Bucket: bus.OutputBucket("sql"), Name: "RUNQ/q/2"}, bus.ErrOutputForeign},
		{&planexv1.OutputRef{Bucket: bus.OutputBucket("sql"), Name: "RUNQ/q/1/x/y"}, bus.ErrOutputForeign},
		{&planexv1.OutputRef{Bucket: bus.OutputBucket("sql"), Name: "RUNQ/q/10"}, bus.ErrOutputForeign},
	} {
		if err := bus.CheckStepOutputRef(tc.ref, "sql", "RUNQ", "q", 1); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("step output ref %s/%s: %v, want %v", tc.ref.GetBucket(), tc.ref.GetName(), err, tc.want)
		}
	}
}
