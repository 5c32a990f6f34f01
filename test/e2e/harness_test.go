// Package e2e holds planex's end-to-end tests: the real planex binary, run
// as separate processes (or as `planex run --dev`), against an embedded
// NATS server and, for traces, a real Jaeger v2 built from the pinned
// tools/jaeger module.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/testbin"
)

var (
	buildOnce sync.Once
	planexBin string
	buildErr  error
)

// repoRoot is the repository root (two levels up from this package).
func repoRoot(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// planex builds the planex binary once per test process.
func planex(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "planex-e2e")
		if err != nil {
			buildErr = err
			return
		}
		planexBin, buildErr = testbin.Planex(repoRoot(t), dir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return planexBin
}

// proc is a planex (or Jaeger) process started by a test.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs strings.Builder
	exit chan error
}

// startProc starts bin with args and env, keeps its stderr for failure
// reports, and kills it when the test ends.
func startProc(t testing.TB, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), exit: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.logs.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		p.exit <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("--- %s logs ---\n%s", name, tail(p.Logs(), 60))
		}
	})
	return p
}

// Logs returns what the process wrote to stderr so far.
func (p *proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// waitLog waits until a JSON log line has msg == want, or the process
// exits, or the timeout passes.
func (p *proc) waitLog(t testing.TB, want string, timeout time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(p.Logs(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == want {
				return rec
			}
		}
		select {
		case err := <-p.exit:
			p.exit <- err
			t.Fatalf("%s exited (%v) before logging %q:\n%s", p.name, err, want, tail(p.Logs(), 40))
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not log %q within %v:\n%s", p.name, want, timeout, tail(p.Logs(), 40))
	return nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ctxT is a test context with a deadline.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
