package stepsign

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// MaxValidity bounds how far in the future a signature may expire; it
// also bounds how long the replay cache remembers a signature.
const MaxValidity = 48 * time.Hour

// Verifier checks signed step requests against a set of trusted public
// keys and remembers the signatures it accepted, to refuse replays.
type Verifier struct {
	tenant   string // the tenant whose account delivers the requests
	keysPath string
	now      func() time.Time
	logger   *slog.Logger
	refused  metric.Int64Counter

	mu     sync.Mutex
	shared *SharedReplays
	stamp  string
	keys   map[string]ed25519.PublicKey
	seen   map[[32]byte]seenEntry
	adds   int
}

type seenEntry struct {
	seq     uint64
	expires time.Time
}

// VerifierOptions configure a Verifier.
type VerifierOptions struct {
	// KeysPath is a public key file (PKIX PEM) or a directory of them
	// (*.pem, *.pub); it is re-read when it changes.
	KeysPath string
	// Logger receives one line per refused request.
	Logger *slog.Logger
	// Now is the clock (tests).
	Now func() time.Time
	// Tenant is the tenant whose account delivers the requests ("" or
	// "default": the default tenant): a step signed for another tenant is
	// refused (ErrWrongTenant).
	Tenant string
}

// NewVerifier loads the trusted keys.
func NewVerifier(o VerifierOptions) (*Verifier, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	refused, err := otel.Meter("github.com/planex-dev/planex/internal/stepsign").Int64Counter("planex.executor.steps.refused",
		metric.WithDescription("Step requests refused before execution: unsigned, unknown key, bad signature, expired, replayed or without approval."))
	if err != nil {
		return nil, err
	}
	v := &Verifier{keysPath: o.KeysPath, now: o.Now, logger: o.Logger, refused: refused, seen: map[[32]byte]seenEntry{}, tenant: o.Tenant}
	if err := v.reload(); err != nil {
		return nil, err
	}
	return v, nil
}

func (v *Verifier) reload() error {
	stamp, files, err := keyFiles(v.keysPath)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if stamp == v.stamp {
		return nil
	}
	keys := map[string]ed25519.PublicKey{}
	for _, f := range files {
		pub, err := readPublicKey(f)
		if err != nil {
			return err
		}
		keys[KeyID(pub)] = pub
	}
	if len(keys) == 0 {
		return fmt.Errorf("--step-verify-keys %s: no ed25519 public key", v.keysPath)
	}
	v.keys, v.stamp = keys, stamp
	return nil
}

func keyFiles(path string) (stamp string, files []string, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", nil, fmt.Errorf("--step-verify-keys: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Sprintf("%d:%d", fi.Size(), fi.ModTime().UnixNano()), []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return "", nil, fmt.Errorf("--step-verify-keys: %w", err)
	}
	var sb strings.Builder
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || strings.HasPrefix(n, ".") || (!strings.HasSuffix(n, ".pem") && !strings.HasSuffix(n, ".pub")) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		fmt.Fprintf(&sb, "%s:%d:%d;", n, info.Size(), info.ModTime().UnixNano())
		files = append(files, filepath.Join(path, n))
	}
	return sb.String(), files, nil
}

func readPublicKey(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read step verify key: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("step verify key %s: not PEM", path)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("step verify key %s: %w", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("step verify key %s: want ed25519, got %T", path, k)
	}
	return pub, nil
}

// ShareReplays puts the pool's shared replay cache behind the in-memory
// one: a signature this replica has not seen is claimed there too, so a
// replay delivered to another replica of the pool is refused as well.
func (v *Verifier) ShareReplays(s *SharedReplays) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.shared = s
}

// Request is one delivered step request to verify.
type Request struct {
	// Subject, Header and Data of the message as delivered.
	Subject string
	Header  nats.Header
	Data    []byte
	// StreamSeq is the message's stream sequence: a redelivery of the same
	// message (same sequence) is not a replay; the same signature under
	// another sequence is.
	StreamSeq uint64
	// Tool and RequiresApproval: a gated tool needs an approval proof.
	Tool             string
	RequiresApproval bool
}

// Verify accepts a correctly signed, unexpired, not replayed request (with
// an approval proof when the tool requires approval). A refusal is counted
// (planex.executor.steps.refused{reason}) and logged, and its error wraps
// one of the Err* reasons. ErrReplayCacheUnavailable (the shared replay
// cache could not be asked) is counted too, but is no verdict: the caller
// must not execute the request and may present it again later.
func (v *Verifier) Verify(ctx context.Context, r Request) error {
	err := v.verify(ctx, r)
	if err != nil {
		reason := "bad_signature"
		for _, e := range []error{ErrUnsigned, ErrUnknownKey, ErrBadSignature, ErrExpired, ErrReplayed, ErrNoApproval, ErrWrongTenant, ErrReplayCacheUnavailable} {
			if errors.Is(err, e) {
				reason = e.Error()
			}
		}
		v.refused.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason), attribute.String("planex.tool", r.Tool)))
		msg := "refused step request: not executed"
		if errors.Is(err, ErrReplayCacheUnavailable) {
			msg = "step request not executed yet: the shared replay cache is unreachable"
		}
		if v.logger != nil {
			v.logger.WarnContext(ctx, msg, "reason", reason, "subject", r.Subject, "tool", r.Tool,
				"stream_seq", r.StreamSeq, "err", err)
		}
	}
	return err
}

func (v *Verifier) verify(ctx context.Context, r Request) error {
	sigB64, kid, expStr := r.Header.Get(HeaderSignature), r.Header.Get(HeaderKeyID), r.Header.Get(HeaderExpires)
	if sigB64 == "" || kid == "" || expStr == "" {
		return ErrUnsigned
	}
	_ = v.reload() // a broken key directory keeps the previous keys
	v.mu.Lock()
	pub, ok := v.keys[kid]
	v.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: key id %q is not trusted", ErrUnknownKey, kid)
	}
	sig, err := base64.StdEncoding.DecodeString(sigB64)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("%w: malformed signature", ErrBadSignature)
	}
	exp, err := strconv.ParseInt(expStr, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: malformed %s", ErrBadSignature, HeaderExpires)
	}
	approval := r.Header.Get(HeaderApproval)
	if got, want := tenantOrDefault(r.Header.Get(HeaderTenant)), tenantOrDefault(v.tenant); got != want {
		return fmt.Errorf("%w: signed for another tenant than this account's (%s)", ErrWrongTenant, want)
	}
	// The tenant signed is the one this verifier serves, whatever the
	// header says: a header stripped or changed breaks the signature.
	if !ed25519.Verify(pub, signedBytes(v.tenant, r.Subject, kid, exp, approval, r.Data), sig) {
		return ErrBadSignature
	}
	now := v.now()
	expires := time.UnixMilli(exp)
	if !now.Before(expires) {
		return fmt.Errorf("%w: at %s", ErrExpired, expires.UTC().Format(time.RFC3339))
	}
	if expires.Sub(now) > MaxValidity {
		return fmt.Errorf("%w: expiry %s is more than %s away", ErrBadSignature, expires.UTC().Format(time.RFC3339), MaxValidity)
	}
	if r.RequiresApproval && approval == "" {
		return fmt.Errorf("%w: tool %s requires approval", ErrNoApproval, r.Tool)
	}
	return v.remember(ctx, sha256.Sum256(sig), r.StreamSeq, expires, now)
}

// remember records an accepted signature; the same signature on another
// stream sequence is a replay. The in-memory cache answers redeliveries to
// this replica; a signature it has not seen is claimed in the shared cache
// (when set), which knows what the pool's other replicas accepted.
func (v *Verifier) remember(ctx context.Context, key [32]byte, seq uint64, expires, now time.Time) error {
	v.mu.Lock()
	e, ok := v.seen[key]
	shared := v.shared
	v.mu.Unlock()
	if ok && now.Before(e.expires) {
		if e.seq != seq || seq == 0 {
			return fmt.Errorf("%w: signature first seen at stream sequence %d, again at %d", ErrReplayed, e.seq, seq)
		}
		return nil
	}
	if shared != nil {
		if err := shared.claim(ctx, key, seq, expires, now); err != nil {
			return err
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if e, ok := v.seen[key]; ok && now.Before(e.expires) && (e.seq != seq || seq == 0) {
		return fmt.Errorf("%w: signature first seen at stream sequence %d, again at %d", ErrReplayed, e.seq, seq)
	}
	v.seen[key] = seenEntry{seq: seq, expires: expires}
	if v.adds++; v.adds%1024 == 0 {
		for k, e := range v.seen {
			if !now.Before(e.expires) {
				delete(v.seen, k)
			}
		}
	}
	return nil
}

func tenantOrDefault(t string) string {
	if t == "" {
		return defaultTenant
	}
	return t
}
