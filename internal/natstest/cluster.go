package natstest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/freeport"
)

// Cluster is a JetStream cluster of embedded nats-servers routed to each
// other on loopback, each with its store in its own t.TempDir(): what a
// replicated (R3) stream needs, in the test process.
type Cluster struct {
	// Name is the cluster's name (unique per Cluster, so that two
	// clusters of one test never take each other for peers).
	Name    string
	servers []*server.Server
}

// StartCluster starts a cluster of n JetStream servers (3 for R3
// streams), waits until every node is routed to the others and the
// cluster has a JetStream meta leader that answers API requests, and shuts
// it down when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: cluster of %d nodes", n)
	}
	c := &Cluster{Name: fmt.Sprintf("planex-test-%d", time.Now().UnixNano()%1_000_000_000)}
	clusterPorts := make([]int, n)
	var routes []*url.URL
	for i := range n {
		clusterPorts[i] = freeport.Port(t)
		routes = append(routes, &url.URL{Scheme: "nats", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(clusterPorts[i]))})
	}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("%s-%d", c.Name, i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: c.Name, Host: "127.0.0.1", Port: clusterPorts[i]},
			Routes:     routes,
		}
		srv, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("natstest: cluster node %d: %v", i, err)
		}
		go srv.Start()
		c.servers = append(c.servers, srv)
	}
	t.Cleanup(c.Shutdown)
	for _, srv := range c.servers {
		if !srv.ReadyForConnections(20 * time.Second) {
			t.Fatalf("natstest: cluster node %s not ready within 20s", srv.Name())
		}
	}
	if err := c.waitReady(60 * time.Second); err != nil {
		t.Fatalf("natstest: cluster %s: %v", c.Name, err)
	}
	return c
}

// waitReady waits until every node has a route to every other one and
// JetStream answers account info through each node (which needs a meta
// leader).
func (c *Cluster) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		last = c.ready()
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready within %s: %w", timeout, last)
}

func (c *Cluster) ready() error {
	leader := false
	for _, srv := range c.servers {
		if srv.NumRoutes() < len(c.servers)-1 {
			return fmt.Errorf("node %s has %d routes, want %d", srv.Name(), srv.NumRoutes(), len(c.servers)-1)
		}
		leader = leader || srv.JetStreamIsLeader()
	}
	if !leader {
		return fmt.Errorf("no JetStream meta leader")
	}
	for _, srv := range c.servers {
		nc, err := nats.Connect(srv.ClientURL(), nats.Timeout(2*time.Second))
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
		}
		nc.Close()
		if err != nil {
			return fmt.Errorf("node %s: account info: %w", srv.Name(), err)
		}
	}
	return nil
}

// URL is the client URL of every node, comma separated, as a client's
// server list (nats.Connect and --nats-url take it).
func (c *Cluster) URL() string {
	urls := make([]string, len(c.servers))
	for i, srv := range c.servers {
		urls[i] = srv.ClientURL()
	}
	return strings.Join(urls, ",")
}

// Connect opens a client connection to the cluster, closed when the test
// ends.
func (c *Cluster) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("natstest: connect to cluster %s: %v", c.Name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Shutdown stops every node (idempotent).
func (c *Cluster) Shutdown() {
	for _, srv := range c.servers {
		srv.Shutdown()
	}
	for _, srv := range c.servers {
		srv.WaitForShutdown()
	}
}
