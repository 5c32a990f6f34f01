package devstack

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestWaitServing: `planex run --dev` on the data directory of a planex
// dev that is still starting waits for its address (recorded once every
// service, pools included, serves) instead of failing, and gives up when
// that stack stops first.
func TestWaitServing(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no flock on Windows")
	}
	dir := t.TempDir()
	l, err := lockDir(dir, "dev")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var h Holder
	go func() {
		var err error
		h, err = WaitServing(context.Background(), dir, 20*time.Second)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("WaitServing returned %v before the stack served", err)
	case <-time.After(300 * time.Millisecond): // a few polls
	}
	if err := l.setAddr("127.0.0.1:7400"); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil || h.Addr != "127.0.0.1:7400" || h.Command != "dev" {
		t.Fatalf("WaitServing: %+v %v, want the recorded address", h, err)
	}
	l.release()

	// A stack that stops before serving.
	l, err = lockDir(dir, "dev")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := WaitServing(context.Background(), dir, 20*time.Second)
		got <- err
	}()
	l.release()
	if err := <-got; !errors.Is(err, ErrStoppedStarting) {
		t.Fatalf("WaitServing after the holder stopped: %v, want ErrStoppedStarting", err)
	}

	// Nobody ever serves: the timeout.
	l, err = lockDir(dir, "dev")
	if err != nil {
		t.Fatal(err)
	}
	defer l.release()
	if _, err := WaitServing(context.Background(), dir, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitServing with no address: %v, want the deadline", err)
	}
}
