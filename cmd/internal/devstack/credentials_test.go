package devstack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// TestEnsureCredentials: first start generates every credential with
// private files 0600; a restart reuses them (tokens and keys unchanged);
// the CLI token authenticates as admin; the context is found by address.
func TestEnsureCredentials(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	dir := t.TempDir()
	c, err := EnsureCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{c.Services.KeyFile, c.CLITokenFile, c.APIKeysFile, c.SigningKeyFile, c.NATSSeedFiles["executor-sql"], filepath.Join(c.Dir, "ca-key.pem")} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	token, err := os.ReadFile(c.CLITokenFile)
	if err != nil {
		t.Fatal(err)
	}
	again, err := EnsureCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	token2, _ := os.ReadFile(again.CLITokenFile)
	if string(token) != string(token2) || again.natsPublic["supervisor"] != c.natsPublic["supervisor"] {
		t.Fatal("a restart regenerated the credentials")
	}
	keys, err := authn.NewAPIKeys(c.APIKeysFile)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := keys.Authenticate(string(token[:len(token)-1])); err != nil || id.Role() != authn.RoleAdmin {
		t.Fatalf("CLI token: %+v %v", id, err)
	}
	if _, err := stepsign.NewVerifier(stepsign.VerifierOptions{KeysPath: c.VerifyKeysDir}); err != nil {
		t.Fatalf("step verify keys: %v", err)
	}
	flags := tlsconfig.Flags{Files: c.Services, ClientAuth: tlsconfig.ClientAuthVerifyIfGiven}
	if _, err := flags.ServerCredentials(); err != nil {
		t.Fatalf("service certificate: %v", err)
	}
	if _, err := writeContext("127.0.0.1:7499", "nats://127.0.0.1:4999", c); err != nil {
		t.Fatal(err)
	}
	forgetContext("127.0.0.1:7499", "") // in-process entry gone, file stays
	cc, ok := LookupClientContext("localhost:7499")
	if !ok || cc.TokenFile != c.CLITokenFile || cc.CAFile != c.CAFile || cc.NATSURL != "nats://127.0.0.1:4999" || cc.NATSSeedFile != c.NATSSeedFiles["supervisor"] {
		t.Fatalf("client context: %+v %v", cc, ok)
	}
}
