package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
)

// Tuning is the dynamic configuration the anchor gives the dev server: one
// task-queue partition, and eager activity execution enabled.
var Tuning = []string{
	"matching.numTaskqueueReadPartitions=1",
	"matching.numTaskqueueWritePartitions=1",
	"system.enableActivityEagerExecution=true",
}

// namespace is the dev server's default namespace, which it always creates.
const namespace = "default"

// DevServer is a Temporal dev server (`temporal server start-dev`)
// running in its own process group.
type DevServer struct {
	// Address is the frontend's host:port.
	Address string
	// MetricsURL is the server's Prometheus endpoint.
	MetricsURL string
	// Args are the arguments given to the CLI (`temporal ...`).
	Args []string

	cmd    *exec.Cmd
	dir    string // temporary directory holding the server's log
	exited chan struct{}
	err    error // the process's exit, once exited is closed
}

// StartDevServer starts a dev server on free loopback ports with the
// anchor's tuning and extra (appended to the start-dev arguments), from
// the CLI pinned in the module directory dir (`go tool -n temporal` builds
// it the first time and names the binary), and waits up to timeout for it
// to serve the default namespace. The server is the harness's own child,
// in a process group of its own; on Linux it is killed if the harness dies.
func StartDevServer(ctx context.Context, dir string, extra []string, timeout time.Duration) (_ *DevServer, err error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	bin, err := cliBinary(ctx, dir, timeout)
	if err != nil {
		return nil, err
	}
	args := []string{"server", "start-dev",
		"--headless", "--ip", "127.0.0.1",
		"--port", strconv.Itoa(ports[0]),
		"--http-port", strconv.Itoa(ports[1]),
		"--metrics-port", strconv.Itoa(ports[2]),
	}
	for _, kv := range Tuning {
		args = append(args, "--dynamic-config-value", kv)
	}
	args = append(args, extra...)

	tmp, err := os.MkdirTemp("", "temporal-anchor-")
	if err != nil {
		return nil, fmt.Errorf("dev server log directory: %w", err)
	}
	logFile, err := os.Create(filepath.Join(tmp, "server.log"))
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Errorf("dev server log: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor

	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	setProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Errorf("start `%s %s`: %w", bin, strings.Join(args, " "), err)
	}
	s := &DevServer{
		Address:    net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		MetricsURL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2])) + "/metrics",
		Args:       args,
		cmd:        cmd,
		dir:        tmp,
		exited:     make(chan struct{}),
	}
	go func() {
		s.err = cmd.Wait()
		close(s.exited)
	}()
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n--- dev server log (tail) ---\n%s", err, s.logTail(40))
			s.Stop()
		}
	}()
	if err := s.waitReady(ctx, timeout); err != nil {
		return nil, err
	}
	return s, nil
}

// cliBinary returns the path of the Temporal CLI pinned as a Go tool in
// the module directory dir, building it if the build cache lacks it.
func cliBinary(ctx context.Context, dir string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "tool", "-n", "temporal")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build the Temporal CLI (`go tool -n temporal` in %s): %w\n%s", dir, err, stderr.String())
	}
	bin := strings.TrimSpace(string(out))
	if bin == "" {
		return "", fmt.Errorf("`go tool -n temporal` in %s named no binary", dir)
	}
	return bin, nil
}

// waitReady dials the server until it answers and describes the default
// namespace, or the process exits, or timeout passes.
func (s *DevServer) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("dev server exited before it was ready: %v", s.err)
		case <-ctx.Done():
			return fmt.Errorf("dev server at %s not ready within %s (last error: %v)", s.Address, timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
		last = ping(ctx, s.Address)
		if last == nil {
			return nil
		}
	}
}

// ping dials addr and describes the default namespace.
func ping(ctx context.Context, addr string) error {
	c, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: namespace}); err != nil {
		return fmt.Errorf("describe namespace %s: %w", namespace, err)
	}
	return nil
}

// dial connects an SDK client to addr in the default namespace, logging
// only the SDK's warnings and errors.
func dial(ctx context.Context, addr string) (client.Client, error) {
	logger := sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := client.DialContext(dctx, client.Options{HostPort: addr, Namespace: namespace, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("dial Temporal at %s: %w", addr, err)
	}
	return c, nil
}

// Stop ends the server's process group (SIGTERM, then SIGKILL after 15 s)
// and removes its log. It is safe to call more than once.
func (s *DevServer) Stop() {
	if s == nil || s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
	default:
		signalGroup(s.cmd, false)
		select {
		case <-s.exited:
		case <-time.After(15 * time.Second):
			signalGroup(s.cmd, true)
			<-s.exited
		}
	}
	// The server may have left children in its group: make sure none is
	// left.
	signalGroup(s.cmd, true)
	_ = os.RemoveAll(s.dir)
	s.cmd = nil
}

// logTail returns the last n lines of the server's log.
func (s *DevServer) logTail(n int) string {
	b, err := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// cliVersion is the version of the Temporal CLI module pinned in dir's
// go.mod.
func cliVersion(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", "github.com/temporalio/cli")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/temporalio/cli: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// eagerCount reads the server's activity_eager_execution counter (the
// number of activities it handed out eagerly, summed over its label sets)
// from its Prometheus endpoint. A counter never incremented is absent: 0.
func eagerCount(ctx context.Context, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("metrics %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("metrics %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	return sumCounter(resp.Body, "activity_eager_execution")
}

// sumCounter sums the samples of the Prometheus counter name (with or
// without the _total suffix) in a text exposition.
func sumCounter(r io.Reader, name string) (int, error) {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		rest, ok := bytes.CutPrefix(line, []byte(name))
		if !ok {
			continue
		}
		rest, _ = bytes.CutPrefix(rest, []byte("_total"))
		if len(rest) == 0 || (rest[0] != '{' && rest[0] != ' ') {
			continue // another metric sharing the prefix
		}
		fields := strings.Fields(string(rest[bytes.LastIndexByte(rest, '}')+1:]))
		if len(fields) == 0 {
			return 0, fmt.Errorf("metric line %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read metrics: %w", err)
	}
	return int(sum), nil
}
