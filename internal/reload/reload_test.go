package reload

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeKill records the signals a Reloader sends.
type fakeKill struct {
	mu   sync.Mutex
	pids []int
	sent chan struct{}
}

func newFakeKill() *fakeKill { return &fakeKill{sent: make(chan struct{}, 16)} }

func (f *fakeKill) kill(pid int, sig syscall.Signal) error {
	if sig != syscall.SIGHUP {
		return errors.New("unexpected signal " + sig.String())
	}
	f.mu.Lock()
	f.pids = append(f.pids, pid)
	f.mu.Unlock()
	f.sent <- struct{}{}
	return nil
}

func (f *fakeKill) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pids)
}

// syncBuffer is a log sink safe for the reloader goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startReloader runs a Reloader with a fake kill until the test ends.
func startReloader(t *testing.T, cfg Config, fk *fakeKill) *syncBuffer {
	t.Helper()
	logs := &syncBuffer{}
	r, err := New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.kill = fk.kill
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	// Changes count from the first read: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "watching files") {
		if time.Now().After(deadline) {
			t.Fatalf("reloader did not start:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return logs
}

func waitSignal(t *testing.T, fk *fakeKill, within time.Duration) {
	t.Helper()
	select {
	case <-fk.sent:
	case <-time.After(within):
		t.Fatalf("no signal within %s", within)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestReloaderSignalsOnceAfterChange(t *testing.T) {
	dir := t.TempDir()
	crt, key, pidFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "nats.pid")
	write(t, crt, "cert-one")
	write(t, key, "SECRET-KEY-ONE")
	write(t, pidFile, "4242\n")
	fk := newFakeKill()
	logs := startReloader(t, Config{PidFile: pidFile, Files: []string{crt, key}, Interval: 100 * time.Millisecond}, fk)

	write(t, key, "SECRET-KEY-TWO")
	waitSignal(t, fk, 10*time.Second)
	// Unchanged files afterwards: no further signal over several polls.
	select {
	case <-fk.sent:
		t.Fatal("signalled again without a change")
	case <-time.After(time.Second):
	}
	if fk.count() != 1 || fk.pids[0] != 4242 {
		t.Fatalf("signals = %v, want one to pid 4242", fk.pids)
	}
	out := logs.String()
	if !strings.Contains(out, "tls.key") {
		t.Errorf("log does not name the changed file:\n%s", out)
	}
	if strings.Contains(out, "tls.crt]") || strings.Contains(out, "SECRET-KEY") {
		t.Errorf("log names an unchanged file or prints contents:\n%s", out)
	}
}

func TestReloaderRetriesWhenPidFileMissing(t *testing.T) {
	dir := t.TempDir()
	crt, pidFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "nats.pid")
	write(t, crt, "cert-one")
	fk := newFakeKill()
	logs := startReloader(t, Config{PidFile: pidFile, Files: []string{crt}, Interval: 100 * time.Millisecond}, fk)

	write(t, crt, "cert-two")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "retrying at next poll") {
		if time.Now().After(deadline) {
			t.Fatalf("no retry logged while the pid file is missing:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if fk.count() != 0 {
		t.Fatal("signalled without a pid file")
	}
	write(t, pidFile, "99")
	waitSignal(t, fk, 10*time.Second)
}

func TestReloaderFileAppearingLater(t *testing.T) {
	dir := t.TempDir()
	crt, pidFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "nats.pid")
	write(t, pidFile, "77")
	fk := newFakeKill()
	startReloader(t, Config{PidFile: pidFile, Files: []string{crt}, Interval: 100 * time.Millisecond}, fk)
	write(t, crt, "cert")
	waitSignal(t, fk, 10*time.Second)
}

func TestReloaderBadPidFileNotQuoted(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "nats.pid")
	write(t, pidFile, "-----BEGIN PRIVATE KEY-----")
	r, err := New(Config{PidFile: pidFile, Files: []string{pidFile}}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.signal()
	if err == nil || strings.Contains(err.Error(), "PRIVATE") {
		t.Fatalf("signal error = %v, want an error without the file's contents", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Files: []string{"a"}}, "--pid-file"},
		{Config{PidFile: "p"}, "--watch"},
		{Config{PidFile: "p", Files: []string{"a", " "}}, "--watch"},
		{Config{PidFile: "p", Files: []string{"a"}, Interval: time.Millisecond}, "--interval"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if err := (&Config{PidFile: "p", Files: []string{"a"}}).Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}
