package devstack

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLockDirIsExclusive(t *testing.T) {
	dir := t.TempDir()
	first, err := lockDir(dir, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.setAddr("127.0.0.1:7400"); err != nil {
		t.Fatal(err)
	}
	_, err = lockDir(dir, "run")
	var inUse *InUseError
	if !errors.As(err, &inUse) || !errors.Is(err, ErrInUse) {
		t.Fatalf("second lock: %v, want an InUseError", err)
	}
	want := Holder{PID: os.Getpid(), Command: "dev", Addr: "127.0.0.1:7400"}
	if inUse.Holder != want || inUse.Dir != dir {
		t.Fatalf("holder %+v in %s, want %+v in %s", inUse.Holder, inUse.Dir, want, dir)
	}
	for _, s := range []string{"data dir " + dir + " in use by pid ", "(planex dev)", "use --data-dir"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q lacks %q", err, s)
		}
	}

	first.release()
	second, err := lockDir(dir, "run")
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	defer second.release()
	if h, err := ReadHolder(dir); err != nil || h.Command != "run" || h.Addr != "" {
		t.Fatalf("holder after relock: %+v, %v", h, err)
	}
}

func TestLastDataDir(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir()) // os.UserCacheDir on macOS
	if _, err := LastDataDir(); err == nil {
		t.Fatal("LastDataDir without a recorded stack: no error")
	}
	dir := filepath.Join(t.TempDir(), "data")
	recordLastUsed(dir)
	if got, err := LastDataDir(); err != nil || got != dir {
		t.Fatalf("LastDataDir = %q, %v; want %q", got, err, dir)
	}
}

func TestDefaultDataDirHelpHidesHome(t *testing.T) {
	home, _ := os.UserHomeDir()
	h := DefaultDataDirHelp("dev")
	if home != "" && strings.Contains(h, home) {
		t.Fatalf("help %q shows the home directory", h)
	}
	if !strings.HasSuffix(h, "planex/dev") && !strings.HasSuffix(h, `planex\dev`) {
		t.Fatalf("help %q does not end in planex/dev", h)
	}
}
