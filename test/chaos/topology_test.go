// Package chaos runs planex's production topology as separate OS
// processes on loopback — a 3-node NATS JetStream cluster built from the
// nats-server module pinned in go.mod, 2 supervisors, the planner and 2
// replicas of every executor pool, mail going to an SMTP sink inside the
// test — puts a mixed workload on it and kills (SIGKILL) supervisors,
// executors, the planner and one NATS node at a time, restarting each.
// It fails on any lost run, duplicate mail or succeeded run without its
// mail. See docs/chaos.md.
package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/freeport"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/testbin"
	"github.com/planex-dev/planex/services/executor/searchpool"
	"github.com/planex-dev/planex/services/planner/playbook"
)

// repoRoot is the repository root (two levels up from this package).
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// build returns the planex binary ($PLANEX_BINARY, or built into dir) and
// nats-server built into dir from the version pinned in go.mod.
func build(t *testing.T, dir string) (planex, natsServer string) {
	t.Helper()
	natsServer = filepath.Join(dir, "nats-server")
	var err error
	if planex, err = testbin.Planex(repoRoot(), dir); err != nil {
		t.Fatal(err)
	}
	if err := testbin.Build(repoRoot(), "github.com/nats-io/nats-server/v2", natsServer); err != nil {
		t.Fatal(err)
	}
	return planex, natsServer
}

// proc is one OS process of the topology. It can be killed with SIGKILL
// and started again with the same arguments (same ports, same store); a
// process that exits on its own is restarted after a second, as
// Kubernetes would.
type proc struct {
	name    string
	bin     string
	args    []string
	logPath string
	ready   func(ctx context.Context, p *proc) error

	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	logOffset  int64 // log size when the current process started
	killing    bool
	stopped    bool
	selfExits  int
	starts     int
	lastStart  time.Time
	keeperDone chan struct{}
}

// start starts the process unless it is running; it does not wait until
// it is ready.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			return nil // running: the keeper and the chaos loop both restart
		}
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	st, _ := f.Stat()
	p.logOffset = st.Size()
	fmt.Fprintf(f, "=== start %d at %s\n", p.starts+1, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.exited, p.killing = cmd, make(chan struct{}), false
	p.starts++
	p.lastStart = time.Now()
	exited := p.exited
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(exited)
	}()
	return nil
}

// keep restarts the process whenever it exits by itself, until stop.
func (p *proc) keep(ctx context.Context, logf func(string, ...any)) {
	p.keeperDone = make(chan struct{})
	go func() {
		defer close(p.keeperDone)
		for {
			p.mu.Lock()
			exited, gen := p.exited, p.starts
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-exited:
			}
			p.mu.Lock()
			if p.stopped {
				p.mu.Unlock()
				return
			}
			if p.killing || p.starts != gen { // a deliberate kill: the chaos loop restarts it
				p.mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
			p.selfExits++
			p.mu.Unlock()
			logf("%s exited by itself; restarting in 1s:\n%s", p.name, p.tail(15))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if err := p.start(); err != nil {
				logf("restart %s: %v", p.name, err)
			}
		}
	}()
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	p.mu.Lock()
	p.killing = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	_ = cmd.Process.Kill()
	<-exited
}

// restart starts a killed process again.
func (p *proc) restart() error { return p.start() }

// stop ends the process for good (SIGTERM, then SIGKILL after grace).
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// replace ends the process as a rolling update ends a pod (SIGTERM, then
// SIGKILL once grace has passed) and starts bin with args in its place:
// same name, log, ports and store. The keeper does not restart the old
// one. graceful reports whether it exited within grace.
func (p *proc) replace(bin string, args []string, grace time.Duration) (graceful bool, err error) {
	p.mu.Lock()
	p.killing = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	graceful = true
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(grace):
			graceful = false
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	p.mu.Lock()
	p.bin, p.args = bin, args
	p.mu.Unlock()
	return graceful, p.start()
}

// logSince returns what the current process wrote.
func (p *proc) logSince() string {
	p.mu.Lock()
	off := p.logOffset
	p.mu.Unlock()
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// tail returns the last n lines of the log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitReady polls p.ready until it succeeds or ctx ends.
func (p *proc) waitReady(ctx context.Context) error {
	var last error
	for {
		if last = p.ready(ctx, p); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w\n%s", p.name, last, p.tail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serving is the readiness of a planex service: it logged "serving"
// since it last started.
func serving(_ context.Context, p *proc) error {
	sc := bufio.NewScanner(strings.NewReader(p.logSince()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"msg":"serving"`) {
			return nil
		}
	}
	return fmt.Errorf("no \"serving\" log line yet")
}

// natsNode is one node of the NATS cluster.
type natsNode struct {
	*proc
	clientPort, monitorPort int
}

// natsReady is the readiness of a NATS node: /healthz answers 200 (the
// node is connected to the cluster and its JetStream assets are current).
func natsReady(monitorPort int) func(context.Context, *proc) error {
	return func(ctx context.Context, _ *proc) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/healthz", monitorPort), nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz %d: %s", resp.StatusCode, body)
		}
		return nil
	}
}

// startNATSCluster starts three JetStream nodes clustered on loopback and
// waits until the cluster has a meta leader and can place an R3 stream.
func startNATSCluster(t *testing.T, ctx context.Context, bin, dir string) []*natsNode {
	t.Helper()
	// A port freeport.Port found free can be taken before the node binds it
	// (by another test's processes on the machine): a node that exits
	// saying so is started again, with the whole cluster on new ports.
	var nodes []*natsNode
	for attempt := 1; ; attempt++ {
		var taken string
		nodes, taken = tryNATSCluster(t, ctx, bin, dir)
		if taken == "" {
			break
		}
		for _, nd := range nodes {
			nd.stop(0)
		}
		if attempt == 3 {
			t.Fatalf("NATS cluster: a port was taken on each of 3 attempts; last: %s", taken)
		}
		t.Logf("NATS cluster: %s; starting it again on other ports", taken)
	}
	// JetStream needs a meta leader before streams can be created.
	nc, err := nats.Connect(natsURL(nodes))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := js.AccountInfo(ctx); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("NATS cluster has no JetStream meta leader: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// And every peer current: an R3 stream can be placed (a meta leader
	// alone still refuses one for a while with "peer offline").
	for {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CHAOS_PLACEMENT", Subjects: []string{"chaos.placement"},
			Storage: jetstream.MemoryStorage, Replicas: 3})
		if err == nil {
			if err := js.DeleteStream(ctx, "CHAOS_PLACEMENT"); err != nil {
				t.Fatalf("delete the placement check's stream: %v", err)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("NATS cluster cannot place an R3 stream: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nodes
}

// tryNATSCluster starts three clustered nodes on fresh ports and waits
// until each is ready. When a node exits because one of its ports is in
// use, it returns the nodes and that node's name and log line.
func tryNATSCluster(t *testing.T, ctx context.Context, bin, dir string) (nodes []*natsNode, taken string) {
	t.Helper()
	const n = 3
	cluster := make([]int, n)
	for i := range cluster {
		cluster[i] = freeport.Port(t)
	}
	var routes []string
	for _, c := range cluster {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", c))
	}
	nodes = make([]*natsNode, n)
	for i := range nodes {
		client, monitor := freeport.Port(t), freeport.Port(t)
		name := fmt.Sprintf("nats-%d", i+1)
		p := &proc{
			name: name, bin: bin, logPath: filepath.Join(dir, name+".log"),
			args: []string{
				"--addr", "127.0.0.1", "--port", fmt.Sprint(client), "--http_port", fmt.Sprint(monitor),
				"--server_name", name, "--jetstream", "--store_dir", filepath.Join(dir, name),
				"--cluster_name", "planex-chaos", "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", cluster[i]),
				"--routes", strings.Join(routes, ","),
			},
			ready: natsReady(monitor),
		}
		nodes[i] = &natsNode{proc: p, clientPort: client, monitorPort: monitor}
		// A new cluster each attempt: no state of an earlier one.
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range nodes {
		ready := make(chan error, 1)
		wctx, cancel := context.WithCancel(ctx)
		go func() { ready <- nd.waitReady(wctx) }()
		nd.mu.Lock()
		exited := nd.exited
		nd.mu.Unlock()
		var err error
		select {
		case err = <-ready:
		case <-exited:
			cancel()
			<-ready
			for _, line := range strings.Split(nd.logSince(), "\n") {
				if strings.Contains(line, "address already in use") {
					return nodes, nd.name + ": " + strings.TrimSpace(line)
				}
			}
			err = fmt.Errorf("%s exited before it was ready:\n%s", nd.name, nd.tail(20))
		}
		cancel()
		if err != nil {
			// Stop the nodes started: a failed test must not leave
			// nats-servers running on the machine.
			for _, n := range nodes {
				n.stop(0)
			}
			t.Fatal(err)
		}
	}
	return nodes, ""
}

// natsURL lists every node, so a client fails over to the others.
func natsURL(nodes []*natsNode) string {
	var urls []string
	for _, nd := range nodes {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", nd.clientPort))
	}
	return strings.Join(urls, ",")
}

// demoData is what the chaos topologies' processes read: the demo SQLite
// database, the demo playbooks, the runbooks for the search pool and the
// step signing key pair, all under dir.
type demoData struct {
	dbPath, books          string
	docs                   []searchpool.Document
	signingKey, verifyKeys string
}

// prepareDemoData writes demoData into dir (a restart finds the files and
// keeps the signing key).
func prepareDemoData(t *testing.T, ctx context.Context, dir string) demoData {
	t.Helper()
	d := demoData{dbPath: filepath.Join(dir, "demo.db"), books: filepath.Join(dir, "playbooks"),
		signingKey: filepath.Join(dir, "step-signing.key"), verifyKeys: filepath.Join(dir, "step-verify")}
	if err := demo.GenerateDB(ctx, d.dbPath); err != nil {
		t.Fatal(err)
	}
	sub, err := fs.Sub(playbook.DemoFS, "demo")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(d.books, sub); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	for _, r := range demo.Runbooks() {
		d.docs = append(d.docs, searchpool.Document{ID: r.ID, Title: r.Title, Body: r.Body, Tags: r.Tags})
	}
	if _, err := os.Stat(d.signingKey); os.IsNotExist(err) {
		if _, err := stepsign.GenerateKeyFiles(d.signingKey, d.verifyKeys); err != nil {
			t.Fatal(err)
		}
	}
	return d
}
