package main

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// TestK8sSecrets: the command prints every Secret the manifests mount;
// the NATS authorization block it generates loads in nats-server with one
// nkey user per service; only the supervisor's certificate carries the
// admin role; the admin key and CA stay in --out-dir, not on the terminal.
func TestK8sSecrets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	var out, errOut bytes.Buffer
	cmd := k8sSecretsCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--namespace", "team-a", "--pools", "sql,email", "--out-dir", dir})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	secrets := map[string]map[string][]byte{}
	var name string
	for _, line := range strings.Split(out.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "  name: "):
			name = strings.TrimPrefix(line, "  name: ")
			secrets[name] = map[string][]byte{}
		case strings.HasPrefix(line, "  namespace: ") && line != "  namespace: team-a":
			t.Fatalf("Secret %s: %s, want namespace team-a", name, line)
		case strings.HasPrefix(line, "  ") && strings.Contains(line, ": ") && name != "" && !strings.HasPrefix(line, "    "):
			k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
			b, err := base64.StdEncoding.DecodeString(v)
			if err == nil {
				secrets[name][k] = b
			}
		}
	}
	want := []string{"nats-auth", "nats-tls", "planex-api-keys", "planex-nats-executor-email", "planex-nats-executor-sql", "planex-nats-planner",
		"planex-nats-supervisor", "planex-step-signing", "planex-step-verify", "planex-tls-executor-email", "planex-tls-executor-sql",
		"planex-tls-planner", "planex-tls-supervisor"}
	var got []string
	for n := range secrets {
		got = append(got, n)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Secrets %v, want %v", got, want)
	}
	for _, svc := range []string{"supervisor", "planner", "executor-sql"} {
		block, _ := pem.Decode(secrets["planex-tls-"+svc]["tls.crt"])
		if block == nil {
			t.Fatalf("planex-tls-%s: no tls.crt", svc)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if isAdmin := slices.Contains(c.Subject.OrganizationalUnit, "admin"); isAdmin != (svc == "supervisor") {
			t.Errorf("planex-tls-%s: OU %v (only the supervisor is admin)", svc, c.Subject.OrganizationalUnit)
		}
		if !slices.Contains(c.DNSNames, "planex-"+svc+".team-a.svc") {
			t.Errorf("planex-tls-%s: DNS names %v lack the Service name", svc, c.DNSNames)
		}
		if c.NotAfter.Before(time.Now().Add(300 * 24 * time.Hour)) {
			t.Errorf("planex-tls-%s expires %s", svc, c.NotAfter)
		}
	}
	if seed := secrets["planex-nats-executor-sql"]["nkey"]; !bytes.HasPrefix(seed, []byte("SU")) {
		t.Errorf("planex-nats-executor-sql: nkey %q is not a user seed", seed)
	}
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, secrets["nats-auth"]["auth.conf"], 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server rejects the generated auth.conf: %v", err)
	}
	if len(opts.Nkeys) != 4 {
		t.Errorf("auth.conf has %d nkey users, want 4 (supervisor, planner, executor-sql, executor-email)", len(opts.Nkeys))
	}
	if len(secrets["planex-step-verify"]) != 1 || len(secrets["planex-step-signing"]["step-signing.key"]) == 0 {
		t.Errorf("step keys: verify %d keys, signing key %d bytes", len(secrets["planex-step-verify"]), len(secrets["planex-step-signing"]["step-signing.key"]))
	}
	token, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil || !strings.HasPrefix(string(token), "pxk_") {
		t.Fatalf("admin.token: %q %v", token, err)
	}
	if strings.Contains(out.String()+errOut.String(), strings.TrimSpace(string(token))) {
		t.Error("the admin API key was printed")
	}
	if !strings.Contains(string(secrets["planex-api-keys"]["api-keys"]), " admin admin") {
		t.Errorf("api-keys: %q, want the admin key's line", secrets["planex-api-keys"]["api-keys"])
	}
	if b, err := os.ReadFile(filepath.Join(dir, "secrets", "nats-auth", "auth.conf")); err != nil || !bytes.Equal(b, secrets["nats-auth"]["auth.conf"]) {
		t.Errorf("--out-dir secrets/nats-auth/auth.conf: %v, want the Secret's auth.conf", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key: %v %v, want mode 0600", fi, err)
	}
}
