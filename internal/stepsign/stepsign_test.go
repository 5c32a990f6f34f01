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

// TestTenantBinding: a step signed for tenant a is refused by the
// verifier of tenant b's account and of the default tenant's, whatever its
// tenant header says; the default tenant's signatures are unchanged (a
// verifier without a tenant accepts a signer without one).
func TestTenantBinding(t *testing.T) {
	dir := t.TempDir()
	trusted := filepath.Join(dir, "trusted")
	if _, err := stepsign.GenerateKeyFiles(filepath.Join(dir, "k.key"), trusted); err != nil {
		t.Fatal(err)
	}
	signer, err := stepsign.LoadSigner(filepath.Join(dir, "k.key"))
	if err != nil {
		t.Fatal(err)
	}
	verifier := func(tenant string) *stepsign.Verifier {
		v, err := stepsign.NewVerifier(stepsign.VerifierOptions{KeysPath: trusted, Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	seq := uint64(0)
	req := func(s *stepsign.Signer, edit func(h map[string][]string)) stepsign.Request {
		seq++
		data := []byte{byte(seq)}
		h := s.Sign("planex.steps.sql.query", data, time.Now().Add(time.Minute), "")
		if edit != nil {
			edit(h)
		}
		return stepsign.Request{Subject: "planex.steps.sql.query", Data: data, StreamSeq: seq, Tool: "sql.query", Header: h}
	}
	ctx := context.Background()
	forA := signer.ForTenant("team-a")
	for _, tc := range []struct {
		name string
		v    *stepsign.Verifier
		r    stepsign.Request
		want error
	}{
		{"a in a", verifier("team-a"), req(forA, nil), nil},
		{"default in default", verifier(""), req(signer, nil), nil},
		{"default signer, explicit default verifier", verifier("default"), req(signer.ForTenant("default"), nil), nil},
		{"a in b", verifier("team-b"), req(forA, nil), stepsign.ErrWrongTenant},
		{"a in default", verifier(""), req(forA, nil), stepsign.ErrWrongTenant},
		{"default in a", verifier("team-a"), req(signer, nil), stepsign.ErrWrongTenant},
		{"a relabelled b in b", verifier("team-b"), req(forA, func(h map[string][]string) { h[stepsign.HeaderTenant] = []string{"team-b"} }), stepsign.ErrBadSignature},
		{"a stripped in default", verifier(""), req(forA, func(h map[string][]string) { delete(h, stepsign.HeaderTenant) }), stepsign.ErrBadSignature},
	} {
		if err := tc.v.Verify(ctx, tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s: Verify = %v, want %v", tc.name, err, tc.want)
		}
	}
}
