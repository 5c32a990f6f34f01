package stepsign

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"
)

// GenerateKeyFiles writes a new ed25519 key pair: the private key (PKCS#8
// PEM, 0600) to privFile for the supervisor and the public key (PKIX PEM)
// to <pubDir>/<key id>.pem for the executors. It returns the key id.
func GenerateKeyFiles(privFile, pubDir string) (string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("generate step signing key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", err
	}
	pder, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(pubDir, 0o750); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(privFile), 0o700); err != nil {
		return "", err
	}
	kid := KeyID(pub)
	if err := os.WriteFile(filepath.Join(pubDir, kid+".pem"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pder}), 0o644); err != nil {
		return "", fmt.Errorf("write step verify key: %w", err)
	}
	if err := os.WriteFile(privFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", fmt.Errorf("write step signing key: %w", err)
	}
	return kid, nil
}

// SignerFlags is the supervisor's --step-signing-key-file.
type SignerFlags struct {
	// KeyFile is the ed25519 private key (PKCS#8 PEM); empty publishes
	// unsigned steps, which executors refuse unless they allow them.
	KeyFile string
}

// RegisterFlags adds --step-signing-key-file.
func (f *SignerFlags) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.KeyFile, "step-signing-key-file", "", "ed25519 private key (PKCS#8 PEM) signing every step request; executors verify it")
}

// Signer loads the signer, nil when no key file is set.
func (f SignerFlags) Signer() (*Signer, error) {
	if f.KeyFile == "" {
		return nil, nil
	}
	return LoadSigner(f.KeyFile)
}

// VerifierFlags are an executor's --step-verify-keys and
// --allow-unsigned-steps.
type VerifierFlags struct {
	// KeysPath is a public key file or directory (rotation: several keys).
	KeysPath string
	// AllowUnsigned runs steps without verification (explicit opt-out).
	AllowUnsigned bool
}

// RegisterFlags adds the flags.
func (f *VerifierFlags) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.KeysPath, "step-verify-keys", "", "ed25519 public key file, or directory of them, trusted to sign step requests (re-read on change)")
	fs.BoolVar(&f.AllowUnsigned, "allow-unsigned-steps", false, "run step requests without verifying their signature (explicit opt-out; anyone who can publish on planex.steps.* runs tools)")
}

// Validate requires a key path unless unsigned steps are allowed.
func (f VerifierFlags) Validate() error {
	if f.KeysPath == "" && !f.AllowUnsigned {
		return errors.New("--step-verify-keys: required (or --allow-unsigned-steps to run steps nobody signed)")
	}
	if f.KeysPath != "" && f.AllowUnsigned {
		return errors.New("--allow-unsigned-steps: conflicts with --step-verify-keys")
	}
	return nil
}

// Verifier loads the verifier, nil when unsigned steps are allowed.
func (f VerifierFlags) Verifier(logger *slog.Logger) (*Verifier, error) {
	if f.AllowUnsigned {
		return nil, nil
	}
	return NewVerifier(VerifierOptions{KeysPath: f.KeysPath, Logger: logger})
}

// VerifierFor is Verifier for the requests of one tenant's account: steps
// signed for another tenant are refused (ErrWrongTenant).
func (f VerifierFlags) VerifierFor(logger *slog.Logger, tenant string) (*Verifier, error) {
	if f.AllowUnsigned {
		return nil, nil
	}
	return NewVerifier(VerifierOptions{KeysPath: f.KeysPath, Logger: logger, Tenant: tenant})
}
