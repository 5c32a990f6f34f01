package stepsign_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/stepsign"
)

// TestReplayBucketIsWatched: the usage gauge (bus) reads the replay
// bucket under the name stepsign creates it with.
func TestReplayBucketIsWatched(t *testing.T) {
	if stepsign.ReplayBucket != bus.BucketStepReplay {
		t.Fatalf("stepsign.ReplayBucket %q, bus.BucketStepReplay %q: the usage gauge would miss the replay cache", stepsign.ReplayBucket, bus.BucketStepReplay)
	}
}

// TestKeyRotation: executors trust every key in the directory; a request
// signed with a removed key is refused once the directory changes.
func TestKeyRotation(t *testing.T) {
	dir := t.TempDir()
	trusted := filepath.Join(dir, "trusted")
	oldKid, err := stepsign.GenerateKeyFiles(filepath.Join(dir, "old.key"), trusted)
	if err != nil {
		t.Fatal(err)
	}
	v, err := stepsign.NewVerifier(stepsign.VerifierOptions{KeysPath: trusted})
	if err != nil {
		t.Fatal(err)
	}
	oldSigner, err := stepsign.LoadSigner(filepath.Join(dir, "old.key"))
	if err != nil {
		t.Fatal(err)
	}
	if oldSigner.KeyID() != oldKid {
		t.Fatalf("key id %s, want %s", oldSigner.KeyID(), oldKid)
	}
	// The new public key is added while the old one is still trusted.
	if _, err := stepsign.GenerateKeyFiles(filepath.Join(dir, "new.key"), trusted); err != nil {
		t.Fatal(err)
	}
	newSigner, err := stepsign.LoadSigner(filepath.Join(dir, "new.key"))
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	req := func(s *stepsign.Signer) stepsign.Request {
		seq++
		data := []byte{byte(seq)}
		return stepsign.Request{Subject: "planex.steps.sql.query", Data: data, StreamSeq: seq, Tool: "sql.query",
			Header: s.Sign("planex.steps.sql.query", data, time.Now().Add(time.Minute), "")}
	}
	ctx := context.Background()
	for name, s := range map[string]*stepsign.Signer{"old": oldSigner, "new": newSigner} {
		if err := v.Verify(ctx, req(s)); err != nil {
			t.Fatalf("%s key during rotation: %v", name, err)
		}
	}
	// Redelivery of the same message (same stream sequence) is accepted;
	// the same signature on another sequence is a replay.
	r := req(newSigner)
	if err := v.Verify(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(ctx, r); err != nil {
		t.Fatalf("redelivery refused: %v", err)
	}
	r.StreamSeq += 1000
	if err := v.Verify(ctx, r); !errors.Is(err, stepsign.ErrReplayed) {
		t.Fatalf("replay: %v, want ErrReplayed", err)
	}
	// Retire the old key.
	if err := os.Remove(filepath.Join(trusted, oldKid+".pem")); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(ctx, req(oldSigner)); !errors.Is(err, stepsign.ErrUnknownKey) {
		t.Fatalf("retired key: %v, want ErrUnknownKey", err)
	}
	// Far-future expiries are refused (they would pin the replay cache).
	data := []byte("x")
	far := stepsign.Request{Subject: "planex.steps.sql.query", Data: data, StreamSeq: 9999, Tool: "sql.query",
		Header: newSigner.Sign("planex.steps.sql.query", data, time.Now().Add(stepsign.MaxValidity+time.Hour), "")}
	if err := v.Verify(ctx, far); !errors.Is(err, stepsign.ErrBadSignature) {
		t.Fatalf("far expiry: %v", err)
	}
}
