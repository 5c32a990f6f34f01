package runlog

import (
	"crypto/sha256"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
)

func TestAppendedMatchesOnlyTheSameBytesAtTheSameSequence(t *testing.T) {
	a := newAppended(2)
	a.add(10, sha256.Sum256([]byte("ten")))
	a.add(11, sha256.Sum256([]byte("eleven")))
	for _, tc := range []struct {
		seq  uint64
		data string
		want bool
	}{
		{10, "ten", true},
		{11, "eleven", true},
		{10, "eleven", false}, // other bytes at a known sequence
		{10, "ten ", false},
		{12, "ten", false}, // a sequence never appended here
	} {
		if got := a.matches(tc.seq, []byte(tc.data)); got != tc.want {
			t.Errorf("matches(%d, %q) = %v, want %v", tc.seq, tc.data, got, tc.want)
		}
	}
	// The oldest is forgotten once more than the size are remembered.
	a.add(12, sha256.Sum256([]byte("twelve")))
	if a.matches(10, []byte("ten")) {
		t.Error("sequence 10 still remembered after two newer appends")
	}
	if !a.matches(11, []byte("eleven")) || !a.matches(12, []byte("twelve")) {
		t.Error("the two latest appends are not remembered")
	}
	a.add(13, sha256.Sum256([]byte("thirteen")))
	a.add(14, sha256.Sum256([]byte("fourteen")))
	if a.matches(11, []byte("eleven")) || a.matches(12, []byte("twelve")) || !a.matches(14, []byte("fourteen")) {
		t.Error("eviction does not follow the order of appends")
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
	if !l.appended.matches(st.StreamSeq, raw.Data) {
		t.Fatalf("the appending log does not match the stored message at %d", st.StreamSeq)
	}
	other, err := New(t.Context(), res, natstest.Logger(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if other.appended.matches(st.StreamSeq, raw.Data) {
		t.Fatal("another log matches a message it did not append")
	}
}
