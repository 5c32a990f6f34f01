package runlog

import (
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
)

func TestAppendedMatchesOnlyTheSameBytes(t *testing.T) {
	a := newAppended(2)
	a.add([]byte("ten"))
	a.add([]byte("eleven"))
	for _, tc := range []struct {
		data string
		want bool
	}{
		{"ten", true},
		{"eleven", true},
		{"ten ", false},
		{"twelve", false},
	} {
		if got := a.matches([]byte(tc.data)); got != tc.want {
			t.Errorf("matches(%q) = %v, want %v", tc.data, got, tc.want)
		}
	}
	// The oldest is forgotten once more than the size are remembered.
	a.add([]byte("twelve"))
	if a.matches([]byte("ten")) {
		t.Error("ten still remembered after two newer appends")
	}
	if !a.matches([]byte("eleven")) || !a.matches([]byte("twelve")) {
		t.Error("the two latest appends are not remembered")
	}
	a.add([]byte("twelve")) // again: still one entry, order unchanged
	a.add([]byte("thirteen"))
	if a.matches([]byte("eleven")) || !a.matches([]byte("twelve")) || !a.matches([]byte("thirteen")) {
		t.Error("eviction does not follow the order of first appends")
	}
	if len(a.by) != 2 {
		t.Errorf("%d digests held, want at most 2", len(a.by))
	}
}

// TestAppendedDigestIsOfTheStoredMessage: what a Log remembers of its
// append is the digest of the bytes the stream stores (what a watch reads
// back), and another Log (another replica) remembers nothing of it.
func TestAppendedDigestIsOfTheStoredMessage(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	l, err := New(t.Context(), res, natstest.Logger(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	tx := l.Begin(&State{})
	if err := tx.Emit(&planexv1.RunEvent{RunId: "RUNAPPENDED", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{
		Goal: "g", Budget: &planexv1.Budget{MaxSteps: 5}}}}); err != nil {
		t.Fatal(err)
	}
	st, err := l.Commit(t.Context(), tx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := l.stream.GetMsg(t.Context(), st.StreamSeq)
	if err != nil {
		t.Fatal(err)
	}
	if !l.appended.matches(raw.Data) {
		t.Fatalf("the appending log does not match the stored message at %d", st.StreamSeq)
	}
	other, err := New(t.Context(), res, natstest.Logger(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if other.appended.matches(raw.Data) {
		t.Fatal("another log matches a message it did not append")
	}
}
