package manifests

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// TestProductionNATSClusterFormsOverRouteTLS loads the production
// overlay's nats.conf, with the Secrets `planex auth k8s-secrets`
// generates in place of its mounts, into three nats-servers (only the
// listen addresses and route URLs mapped to loopback) and checks that the
// routes come up over mutual TLS with the generated certificate and that
// JetStream elects a meta leader: the cluster block the dev overlay
// replaces is exercised too.
func TestProductionNATSClusterFormsOverRouteTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the production NATS cluster test (builds planex, starts 3 NATS servers)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := k8sFS(t).Build("overlays/production")
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, "production", out, "planex", false)
	bin := buildPlanex(t)
	gen := exec.CommandContext(ctx, bin, "auth", "k8s-secrets", "--namespace", "planex", "--pools", "sql,email,search", "--out-dir", t.TempDir())
	secretYAML, err := gen.Output()
	if err != nil {
		t.Fatalf("planex auth k8s-secrets: %v", err)
	}
	secrets, err := Decode(secretYAML, "planex")
	if err != nil {
		t.Fatalf("decode the generated Secrets: %v", err)
	}
	r.Objects = append(r.Objects, secrets...)
	base := natsSecurity(t, r)

	// What the file asks for, before any loopback mapping.
	if base.Cluster.TLSConfig == nil {
		t.Fatal("production nats.conf: the cluster block has no tls")
	}
	if base.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("production nats.conf: route TLS client auth = %v, want verify (mutual TLS)", base.Cluster.TLSConfig.ClientAuth)
	}
	if len(base.Routes) != 3 {
		t.Fatalf("production nats.conf: %d routes, want 3", len(base.Routes))
	}
	for _, u := range base.Routes {
		if u.Scheme != "tls" {
			t.Fatalf("production nats.conf: route %s is not tls://", u)
		}
	}

	const n = 3
	addrs := make([]string, n)
	var routes []*url.URL
	for i := range n {
		addrs[i] = freeAddr(t)
		routes = append(routes, &url.URL{Scheme: "tls", Host: addrs[i]})
	}
	servers := make([]*server.Server, n)
	for i := range n {
		opts := base.Clone()
		host, port, _ := net.SplitHostPort(addrs[i])
		cport, _ := strconv.Atoi(port)
		opts.ServerName = fmt.Sprintf("nats-%d", i)
		opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
		opts.Cluster.Host, opts.Cluster.Port = host, cport
		opts.Routes = routes
		opts.StoreDir, opts.PidFile, opts.NoSigs = t.TempDir(), "", true
		// The certificate names nats-N.nats-headless and localhost; the
		// routes dial 127.0.0.1, so verify against the in-cluster name.
		opts.Cluster.TLSConfig = opts.Cluster.TLSConfig.Clone()
		opts.Cluster.TLSConfig.ServerName = "nats-0.nats-headless"
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("nats server %d with the production config: %v", i, err)
		}
		go s.Start()
		t.Cleanup(s.Shutdown)
		servers[i] = s
	}
	for _, s := range servers {
		if !s.ReadyForConnections(20 * time.Second) {
			t.Fatalf("nats server %s not ready", s.Name())
		}
	}
	for {
		leader, routed := false, true
		for _, s := range servers {
			leader = leader || s.JetStreamIsLeader()
			routed = routed && s.NumRoutes() >= n-1
		}
		if leader && routed {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("production NATS cluster did not form over route TLS: routes %d/%d/%d, meta leader %v",
				servers[0].NumRoutes(), servers[1].NumRoutes(), servers[2].NumRoutes(), leader)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
