package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/planex-dev/planex/internal/authn"
)

// TestAPIKeyTenant: `planex auth api-key --tenant` prints a line whose key
// authenticates as a caller of that tenant; a tenant's key never holds
// platform-admin, and a bad tenant name is refused naming the flag.
func TestAPIKeyTenant(t *testing.T) {
	out, code := planexCLI(t, "auth", "api-key", "ci-a", "--role", "runner", "--tenant", "team-a")
	if code != 0 {
		t.Fatalf("api-key --tenant: exit %d: %s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	key, line := strings.TrimSpace(lines[1]), strings.TrimSpace(lines[3])
	if !strings.HasSuffix(line, " tenant=team-a") {
		t.Fatalf("line %q: want a tenant=team-a field", line)
	}
	file := filepath.Join(t.TempDir(), "api-keys")
	if err := os.WriteFile(file, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := authn.NewAPIKeys(file)
	if err != nil {
		t.Fatal(err)
	}
	id, err := keys.Authenticate(key)
	if err != nil || id.Tenant != "team-a" || id.Subject != "apikey:ci-a" || !id.Has(authn.RoleRunner) {
		t.Fatalf("Authenticate = %v, %v; want apikey:ci-a, runner, tenant team-a", id, err)
	}
	for _, tc := range []struct{ args, want string }{
		{"--role platform-admin --tenant team-a", "--role platform-admin"},
		{"--tenant Team_A", "--tenant"},
	} {
		out, code := planexCLI(t, append([]string{"auth", "api-key", "x"}, strings.Fields(tc.args)...)...)
		if code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("api-key %s: exit %d, %q; want a refusal naming %s", tc.args, code, out, tc.want)
		}
	}
}
