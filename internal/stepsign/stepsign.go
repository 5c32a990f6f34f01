// Package stepsign signs the step requests the supervisor publishes to
// executor pools and verifies them in the executors, so that a message put
// on planex.steps.* by anyone else — a forged step, a replay of a real one,
// an expired one, or a gated tool's step without the approval — is refused
// and never executed.
//
// The signature is an ed25519 signature carried in NATS headers (the step
// payload is unchanged):
//
//	Planex-Key-Id      key id: hex of the first 8 bytes of SHA-256(public key)
//	Planex-Expires     expiry, Unix milliseconds (the attempt's deadline)
//	Planex-Approval    approval proof of a gated step ("gate=…;decision=…;by=…")
//	Planex-Signature   base64 ed25519 signature of
//	                   "planex-step-v1\n<subject>\n<key id>\n<expires>\n<approval>\n<base64 SHA-256(payload)>"
//
// Keys rotate by key id: executors trust every public key in their key
// directory; the supervisor signs with one private key. Add the new public
// key to the executors, switch the supervisor's key, then remove the old
// public key.
package stepsign

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Header names.
const (
	HeaderSignature = "Planex-Signature"
	HeaderKeyID     = "Planex-Key-Id"
	HeaderExpires   = "Planex-Expires"
	HeaderApproval  = "Planex-Approval"
	// HeaderTenant names the tenant a step was signed for (absent: the
	// default tenant). It only explains a refusal: the signature covers
	// the tenant the verifier expects, not the header, so stripping or
	// changing it cannot move a step to another tenant.
	HeaderTenant = "Planex-Tenant"
)

// KeyID is the key id of a public key.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

func signedBytes(tenant, subject, keyID string, expires int64, approval string, data []byte) []byte {
	sum := sha256.Sum256(data)
	b := "planex-step-v1\n" + subject + "\n" + keyID + "\n" + strconv.FormatInt(expires, 10) + "\n" +
		approval + "\n" + base64.StdEncoding.EncodeToString(sum[:])
	if tenant != "" && tenant != defaultTenant {
		// Only a tenant's steps commit to it: the default tenant's
		// signatures are those of releases before tenants.
		b += "\ntenant " + tenant
	}
	return []byte(b)
}

// defaultTenant is the implicit tenant (authn.DefaultTenant).
const defaultTenant = "default"

// Signer signs step requests with one private key.
type Signer struct {
	key    ed25519.PrivateKey
	keyID  string
	tenant string // "" or "default": the default tenant
}

// NewSigner returns a signer for key.
func NewSigner(key ed25519.PrivateKey) *Signer {
	return &Signer{key: key, keyID: KeyID(key.Public().(ed25519.PublicKey))}
}

// LoadSigner reads a PKCS#8 PEM ed25519 private key file.
func LoadSigner(path string) (*Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--step-signing-key-file: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("--step-signing-key-file %s: not PEM", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("--step-signing-key-file %s: %w", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("--step-signing-key-file %s: want an ed25519 key, got %T", path, k)
	}
	return NewSigner(ek), nil
}

// KeyID is the signer's key id.
func (s *Signer) KeyID() string { return s.keyID }

// ForTenant returns a signer with the same key whose signatures commit to
// tenant: an executor serving another tenant's account refuses them
// (ErrWrongTenant). nil stays nil (signing off).
func (s *Signer) ForTenant(tenant string) *Signer {
	if s == nil {
		return nil
	}
	c := *s
	c.tenant = tenant
	return &c
}

// Sign returns the headers that sign data published on subject, valid
// until expires, with the approval proof of a gated step ("" otherwise).
func (s *Signer) Sign(subject string, data []byte, expires time.Time, approval string) nats.Header {
	exp := expires.UnixMilli()
	sig := ed25519.Sign(s.key, signedBytes(s.tenant, subject, s.keyID, exp, approval, data))
	h := nats.Header{}
	if s.tenant != "" && s.tenant != defaultTenant {
		h.Set(HeaderTenant, s.tenant)
	}
	h.Set(HeaderKeyID, s.keyID)
	h.Set(HeaderExpires, strconv.FormatInt(exp, 10))
	if approval != "" {
		h.Set(HeaderApproval, approval)
	}
	h.Set(HeaderSignature, base64.StdEncoding.EncodeToString(sig))
	return h
}

// SignFunc returns a function bus.Publication.Sign can call; nil when s
// is nil (signing off).
func (s *Signer) SignFunc(expires time.Time, approval string) func(subject string, data []byte) nats.Header {
	if s == nil {
		return nil
	}
	return func(subject string, data []byte) nats.Header { return s.Sign(subject, data, expires, approval) }
}

// Approval is the approval proof of step s of run: the decided gate that
// let it run ("gate=<id>;decision=<approve|edit>;by=<identity>"), or
// "policy=auto-approve" when the tool's default gate was waived by
// configuration (autoApproved); "" when no approval was given.
func Approval(run *planexv1.Run, s *planexv1.StepState, autoApproved bool) string {
	for _, g := range run.GetGates() {
		if g.GetStepId() != s.GetStepId() || g.GetPlanRevision() != s.GetPlanRevision() {
			continue
		}
		switch g.GetDecision() {
		case planexv1.DecisionKind_DECISION_KIND_APPROVE, planexv1.DecisionKind_DECISION_KIND_EDIT:
			by := g.GetDecidedBy()
			if by == "" {
				by = g.GetActor()
			}
			return "gate=" + g.GetId() + ";decision=" + strings.ToLower(strings.TrimPrefix(g.GetDecision().String(), "DECISION_KIND_")) + ";by=" + sanitize(by)
		}
	}
	if autoApproved {
		return "policy=auto-approve"
	}
	return ""
}

// sanitize keeps a header value on one line.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == ';' {
			return '_'
		}
		return r
	}, s)
}

// Reasons a step request is refused, as metric and log values.
var (
	ErrUnsigned     = errors.New("unsigned")
	ErrUnknownKey   = errors.New("unknown_key")
	ErrBadSignature = errors.New("bad_signature")
	ErrExpired      = errors.New("expired")
	ErrReplayed     = errors.New("replayed")
	ErrNoApproval   = errors.New("no_approval")
	// ErrWrongTenant: the step was signed for another tenant than the one
	// whose account delivered it.
	ErrWrongTenant = errors.New("wrong_tenant")
)
