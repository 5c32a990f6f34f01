package main

import (
	"crypto/x509"
	"encoding/pem"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// TestK8sSecretsMCPPool: `planex auth k8s-secrets --pools ...,mcp` makes
// everything deploy/k8s/components/mcp-pool and the chart's mcp.enabled
// mount: the pool's certificate (its Service name, no admin role), its
// NATS nkey seed, and a user for that seed in auth.conf permitted its own
// pool's consumer and attempt queries only.
func TestK8sSecretsMCPPool(t *testing.T) {
	secrets, err := k8sSecrets(t.TempDir(), "team-a", []string{"sql", "email", "search", "mcp"}, 24*time.Hour, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]map[string][]byte{}
	for _, s := range secrets {
		byName[s.name] = s.data
	}
	tlsData, seedData := byName["planex-tls-executor-mcp"], byName["planex-nats-executor-mcp"]
	if tlsData == nil || seedData == nil {
		t.Fatalf("no planex-tls-executor-mcp or planex-nats-executor-mcp among %v", slices.Sorted(maps.Keys(byName)))
	}
	block, _ := pem.Decode(tlsData["tls.crt"])
	if block == nil || len(tlsData["tls.key"]) == 0 || len(tlsData["ca.crt"]) == 0 {
		t.Fatal("planex-tls-executor-mcp: want tls.crt, tls.key and ca.crt")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(c.DNSNames, "planex-executor-mcp.team-a.svc") || len(c.Subject.OrganizationalUnit) != 0 {
		t.Errorf("planex-tls-executor-mcp: DNS names %v, OU %v; want the Service name and no admin role", c.DNSNames, c.Subject.OrganizationalUnit)
	}

	kp, err := nkeys.FromSeed(seedData["nkey"])
	if err != nil {
		t.Fatalf("planex-nats-executor-mcp: nkey: %v", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(conf, byName["nats-auth"]["auth.conf"], 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server rejects the generated auth.conf: %v", err)
	}
	var user *server.NkeyUser
	for _, u := range opts.Nkeys {
		if u.Nkey == pub {
			user = u
		}
	}
	if user == nil || user.Permissions == nil || user.Permissions.Publish == nil || user.Permissions.Subscribe == nil {
		t.Fatalf("auth.conf has no user with permissions for the seed of planex-nats-executor-mcp (%s)", pub)
	}
	pubAllow, subAllow := user.Permissions.Publish.Allow, user.Permissions.Subscribe.Allow
	for _, want := range []string{"$JS.API.CONSUMER.MSG.NEXT.PLANEX_STEPS.pool-mcp", "planex.executor.mcp.*.attempts"} {
		if !slices.Contains(pubAllow, want) {
			t.Errorf("executor-mcp may not publish %s", want)
		}
	}
	for _, other := range []string{"$JS.API.CONSUMER.MSG.NEXT.PLANEX_STEPS.pool-sql", "planex.executor.sql.*.attempts", "planex.steps.>", "planex.steps.mcp.>"} {
		if slices.Contains(pubAllow, other) || slices.Contains(subAllow, other) {
			t.Errorf("executor-mcp is allowed %s", other)
		}
	}
}

// TestK8sSecretsConsole: --console issues planex-tls-console, a server
// certificate for the Service planex-console and the public names given,
// with no client use and no NATS identity; without it there is none.
func TestK8sSecretsConsole(t *testing.T) {
	without, err := k8sSecrets(t.TempDir(), "team-a", []string{"sql"}, time.Hour, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range without {
		if strings.Contains(s.name, "console") {
			t.Fatalf("without --console: got Secret %s", s.name)
		}
	}
	secrets, err := k8sSecrets(t.TempDir(), "team-a", []string{"sql"}, time.Hour, true, []string{"planex.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	var data map[string][]byte
	for _, s := range secrets {
		if s.name == "planex-tls-console" {
			data = s.data
		}
		if s.name == "planex-nats-console" {
			t.Error("the console got a NATS nkey; it has no NATS identity")
		}
	}
	if data == nil {
		t.Fatal("--console: no planex-tls-console")
	}
	block, _ := pem.Decode(data["tls.crt"])
	if block == nil || len(data["tls.key"]) == 0 || len(data["ca.crt"]) == 0 {
		t.Fatal("planex-tls-console: want tls.crt, tls.key and ca.crt")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"planex-console", "planex-console.team-a.svc", "planex.example.com"} {
		if !slices.Contains(c.DNSNames, want) {
			t.Errorf("planex-tls-console: DNS names %v lack %s", c.DNSNames, want)
		}
	}
	if slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) || !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		t.Errorf("planex-tls-console: key usage %v, want server only", c.ExtKeyUsage)
	}
}
