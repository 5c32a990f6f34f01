package runlog_test

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// TestLegacyHashesAppendVersion1Events: a supervisor told to append
// version 1 events (--run-log-hash-version 1, during a rolling upgrade from
// a release without per-field commitments) appends events whose hash is
// the version 1 hash — what supervisors of that release verify — and no
// salt; one without the option appends version 2 events.
func TestLegacyHashesAppendVersion1Events(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name   string
		legacy bool
	}{{"version 1", true}, {"version 2", false}} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := runlog.New(ctx, res, natstest.Logger(t), runlog.Options{LegacyHashes: tc.legacy})
			if err != nil {
				t.Fatal(err)
			}
			ev := &planexv1.RunEvent{RunId: "RUNLEGACY" + map[bool]string{true: "1", false: "2"}[tc.legacy],
				Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g", Budget: &planexv1.Budget{MaxSteps: 1}}}}
			tx := l.Begin(&runlog.State{})
			if err := tx.Emit(ev); err != nil {
				t.Fatal(err)
			}
			clone := proto.CloneOf(ev)
			clone.Hash = nil
			data, err := proto.MarshalOptions{Deterministic: true}.Marshal(clone)
			if err != nil {
				t.Fatal(err)
			}
			v1 := sha256.Sum256(data)
			isV1 := bytes.Equal(ev.GetHash(), v1[:]) && len(ev.ProtoReflect().GetUnknown()) == 0
			if isV1 != tc.legacy {
				t.Fatalf("LegacyHashes %v: event is version 1 = %v (unknown fields %d bytes)", tc.legacy, isV1, len(ev.ProtoReflect().GetUnknown()))
			}
			if _, err := runlog.Verify([]*planexv1.RunEvent{ev}, nil); err != nil {
				t.Fatalf("verify: %v", err)
			}
		})
	}
}
