package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
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
	if strings.Contains(errOut.String(), "planex-default") || strings.Contains(string(secrets["nats-auth"]["auth.conf"]), "accounts") {
		t.Errorf("without tenants: stderr %q, auth.conf with accounts: want the global account as before", errOut.String())
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

// parseSecretsYAML reads the Secrets writeSecrets printed: name → key →
// decoded value.
func parseSecretsYAML(t *testing.T, out string) map[string]map[string][]byte {
	t.Helper()
	secrets := map[string]map[string][]byte{}
	var name string
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "  name: "):
			name = strings.TrimPrefix(line, "  name: ")
			secrets[name] = map[string][]byte{}
		case strings.HasPrefix(line, "  ") && strings.Contains(line, ": ") && name != "" && !strings.HasPrefix(line, "    "):
			k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
			if b, err := base64.StdEncoding.DecodeString(v); err == nil {
				secrets[name][k] = b
			}
		}
	}
	return secrets
}

// TestK8sSecretsTenants: --tenant NAME=POOLS adds a Secret of nkey seeds
// per tenant and an account per tenant to auth.conf; a re-run with one
// more tenant keeps every key of the first (CA, nkeys, step and API
// keys), and a nats-server running the first auth.conf, reloaded with the
// second, serves JetStream to the new tenant while the first tenant's
// connection stays up.
func TestK8sSecretsTenants(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	var stderr string
	run := func(args ...string) (map[string]map[string][]byte, error) {
		var out, errOut bytes.Buffer
		cmd := k8sSecretsCmd()
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(append([]string{"--namespace", "team-a", "--pools", "sql", "--out-dir", dir}, args...))
		if err := cmd.Execute(); err != nil {
			return nil, err
		}
		stderr = errOut.String()
		return parseSecretsYAML(t, out.String()), nil
	}
	for _, bad := range [][]string{{"--tenant", "default=sql"}, {"--tenant", "A=sql"}, {"--tenant", "a=sql.x"}, {"--tenant", "a=sql", "--tenant", "a=email"}} {
		if _, err := run(bad...); err == nil || !strings.Contains(err.Error(), "--tenant") {
			t.Errorf("%v: %v, want an error naming --tenant", bad, err)
		}
	}
	first, err := run("--tenant", "a=sql")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(stderr, "Adding the first tenant to an existing installation"); n != 1 || !strings.Contains(stderr, "planex restore") {
		t.Errorf("stderr with a tenant: the move of the default tenant's data told %d times, want once:\n%s", n, stderr)
	}
	if got := first["planex-tenant-a-nats"]; len(got) != 2 || !bytes.HasPrefix(got["supervisor.nk"], []byte("SU")) || !bytes.HasPrefix(got["executor-sql.nk"], []byte("SU")) {
		t.Fatalf("planex-tenant-a-nats: keys %v, want supervisor.nk and executor-sql.nk", slices.Collect(maps.Keys(got)))
	}
	caFirst, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := run("--tenant", "a=sql", "--tenant", "b=sql,email")
	if err != nil {
		t.Fatal(err)
	}
	for name, keys := range first {
		if strings.HasPrefix(name, "planex-tls-") || name == "nats-tls" || name == "nats-auth" {
			continue // re-issued from the same CA; auth.conf gains tenant b
		}
		for k, v := range keys {
			if !bytes.Equal(second[name][k], v) {
				t.Errorf("re-run changed %s/%s", name, k)
			}
		}
	}
	if !bytes.Equal(second["nats-tls"]["ca.crt"], caFirst) {
		t.Error("re-run changed the CA")
	}
	if len(second["planex-tenant-b-nats"]) != 3 {
		t.Errorf("planex-tenant-b-nats: %d keys, want supervisor, executor-sql, executor-email", len(second["planex-tenant-b-nats"]))
	}
	if _, ok := second["planex-nats-admin"]; ok {
		t.Error("planex-nats-admin issued without --nats-admin")
	}
	withAdmin, err := run("--tenant", "a=sql", "--nats-admin")
	if err != nil {
		t.Fatal(err)
	}
	adminSeed := withAdmin["planex-nats-admin"]["nkey"]
	adminKP, err := nkeys.FromSeed(adminSeed)
	if err != nil {
		t.Fatalf("planex-nats-admin: %v", err)
	}
	adminPub, _ := adminKP.PublicKey()
	adminConf := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(adminConf, withAdmin["nats-auth"]["auth.conf"], 0o600); err != nil {
		t.Fatal(err)
	}
	if opts, err := server.ProcessConfigFile(adminConf); err != nil {
		t.Fatal(err)
	} else if i := slices.IndexFunc(opts.Nkeys, func(u *server.NkeyUser) bool { return u.Nkey == adminPub }); i < 0 ||
		opts.Nkeys[i].Account == nil || opts.Nkeys[i].Account.Name != "planex-default" || opts.Nkeys[i].Permissions != nil {
		t.Errorf("--nats-admin: the admin is not an account admin of planex-default in auth.conf:\n%s", withAdmin["nats-auth"]["auth.conf"])
	}
	if again, err := run("--tenant", "a=sql", "--nats-admin"); err != nil || !bytes.Equal(again["planex-nats-admin"]["nkey"], adminSeed) {
		t.Errorf("re-run with --nats-admin changed the admin's key (%v)", err)
	}

	// A server on the first auth.conf, reloaded with the second.
	confDir := t.TempDir()
	conf := filepath.Join(confDir, "nats.conf")
	writeConf := func(auth []byte) {
		t.Helper()
		c := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\ninclude \"auth.conf\"\n", filepath.Join(confDir, "js"))
		if err := os.WriteFile(filepath.Join(confDir, "auth.conf"), auth, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(conf, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeConf(first["nats-auth"]["auth.conf"])
	ns := serveConf(t, conf)
	jsAs := func(seed []byte) (*nats.Conn, error) {
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, err
		}
		pub, _ := kp.PublicKey()
		nc, err := nats.Connect(ns.ClientURL(), nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix("_INBOX_supervisor"))
		if err != nil {
			return nil, err
		}
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLANEX_EVENTS", Subjects: []string{"planex.events.>"}}); err != nil {
			nc.Close()
			return nil, err
		}
		return nc, nil
	}
	a, err := jsAs(first["planex-tenant-a-nats"]["supervisor.nk"])
	if err != nil {
		t.Fatalf("tenant a's supervisor: %v", err)
	}
	defer a.Close()
	// The default tenant is in planex-default: JetStream from the file
	// alone, as on a stock nats-server, and $G has none.
	if ns.GlobalAccount().JetStreamEnabled() {
		t.Error("$G has JetStream")
	}
	def, err := jsAs(first["planex-nats-supervisor"]["nkey"])
	if err != nil {
		t.Fatalf("the default tenant's supervisor on a server started with tenants: %v", err)
	}
	if _, err := def.Request("planex.events.r1.log", []byte("x"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	def.Close()
	if _, err := jsAs(second["planex-tenant-b-nats"]["supervisor.nk"]); err == nil {
		t.Fatal("tenant b connected before the reload")
	}
	writeConf(second["nats-auth"]["auth.conf"])
	if err := ns.Reload(); err != nil {
		t.Fatal(err)
	}
	b, err := jsAs(second["planex-tenant-b-nats"]["supervisor.nk"])
	if err != nil {
		t.Fatalf("tenant b's supervisor after the reload: %v", err)
	}
	b.Close()
	if !a.IsConnected() || a.Stats().Reconnects != 0 {
		t.Errorf("tenant a's connection after the reload: connected %v, %d reconnects", a.IsConnected(), a.Stats().Reconnects)
	}

	// Restarted from the second file: the default tenant's stream is
	// still there, with its message.
	ns.Shutdown()
	ns.WaitForShutdown()
	ns = serveConf(t, conf)
	def, err = jsAs(first["planex-nats-supervisor"]["nkey"])
	if err != nil {
		t.Fatalf("the default tenant's supervisor after a restart: %v", err)
	}
	defer def.Close()
	js, _ := jetstream.New(def)
	st, err := js.Stream(t.Context(), "PLANEX_EVENTS")
	if err != nil || st.CachedInfo().State.Msgs != 1 {
		t.Fatalf("the default tenant's stream after a restart: %v, want it with its message", err)
	}
}
