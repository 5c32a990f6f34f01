package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// LockFile is the name of the lock file in a data directory. One process
// at a time holds an exclusive lock on it (flock on Unix); the kernel
// releases it when the process ends, however it ends.
const LockFile = "planex.lock"

// Holder describes the process that holds a data directory, as written in
// its lock file.
type Holder struct {
	// PID of the process.
	PID int `json:"pid"`
	// Command is "dev" for `planex dev` or "run" for `planex run --dev`.
	Command string `json:"command"`
	// Addr is the supervisor's gRPC address once the stack serves.
	Addr string `json:"addr,omitempty"`
}

// InUseError says that another process holds the data directory. Two
// embedded NATS servers on one JetStream store corrupt it and never finish
// (the second spins in the file store), so the second process must not
// start.
type InUseError struct {
	// Dir is the data directory.
	Dir string
	// Holder is what the lock file says about the holder; PID 0 when it
	// could not be read.
	Holder Holder
}

// Error names the directory, the holder and the way out.
func (e *InUseError) Error() string {
	who := "another process"
	if e.Holder.PID > 0 {
		who = fmt.Sprintf("pid %d", e.Holder.PID)
		if e.Holder.Command != "" {
			who += fmt.Sprintf(" (planex %s)", e.Holder.Command)
		}
	}
	return fmt.Sprintf("data dir %s in use by %s; use --data-dir to pick another directory, or stop that process", e.Dir, who)
}

// ErrInUse is matched by errors.Is for an [*InUseError].
var ErrInUse = errors.New("data dir in use")

// Is makes errors.Is(err, ErrInUse) hold.
func (e *InUseError) Is(target error) bool { return target == ErrInUse }

// dirLock is a held data directory lock.
type dirLock struct {
	f      *os.File
	holder Holder
}

// lockDir takes the exclusive lock of dir at once or fails with an
// *InUseError; it never waits.
func lockDir(dir, command string) (*dirLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: lock: %w", dir, err)
	}
	ok, err := tryLock(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--data-dir %s: lock %s: %w", dir, path, err)
	}
	if !ok {
		_ = f.Close()
		h, _ := ReadHolder(dir)
		return nil, &InUseError{Dir: dir, Holder: h}
	}
	l := &dirLock{f: f, holder: Holder{PID: os.Getpid(), Command: command}}
	if err := l.write(); err != nil {
		l.release()
		return nil, err
	}
	return l, nil
}

// write records the holder in the lock file.
func (l *dirLock) write() error {
	b, err := json.Marshal(l.holder)
	if err != nil {
		return err
	}
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("write lock file: %w", err)
	}
	if _, err := l.f.WriteAt(append(b, '\n'), 0); err != nil {
		return fmt.Errorf("write lock file: %w", err)
	}
	return nil
}

// setAddr records the supervisor's address, so that `planex run --dev`
// can join a running `planex dev`.
func (l *dirLock) setAddr(addr string) error {
	l.holder.Addr = addr
	return l.write()
}

// release drops the lock. The file stays: removing it would let a third
// process lock a new file while a second still waits on the old one.
func (l *dirLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = unlock(l.f)
	_ = l.f.Close()
	l.f = nil
}

// ReadHolder reads what the lock file of dir says about its holder. The
// file may describe a process that has ended: only a failed lock attempt
// proves the directory is held.
func ReadHolder(dir string) (Holder, error) {
	var h Holder
	b, err := os.ReadFile(filepath.Join(dir, LockFile))
	if err != nil {
		return h, err
	}
	if strings.TrimSpace(string(b)) == "" {
		return h, errors.New("lock file is empty")
	}
	err = json.Unmarshal(b, &h)
	return h, err
}

// ServeWait is how long `planex run --dev` waits for a `planex dev` still
// starting on its data directory (WaitServing).
const ServeWait = 2 * time.Minute

// ErrStoppedStarting is returned by WaitServing when the stack holding the
// directory stopped before it served.
var ErrStoppedStarting = errors.New("the dev stack stopped before it served")

// WaitServing waits until the process holding dir (a `planex dev` still
// starting) records its supervisor's address, which it does once every
// service serves and every executor pool has registered, and returns the
// holder. It polls the lock file and fails with ErrStoppedStarting when
// the holder released the directory without serving, with ctx's error,
// or after timeout.
func WaitServing(ctx context.Context, dir string, timeout time.Duration) (Holder, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		h, err := ReadHolder(dir)
		if err == nil && h.Addr != "" {
			return h, nil
		}
		// The file is also empty for a moment while the holder rewrites
		// it: only a free lock says the holder is gone.
		if err != nil && !held(dir) {
			return h, fmt.Errorf("data dir %s: %w", dir, ErrStoppedStarting)
		}
		select {
		case <-ctx.Done():
			return h, fmt.Errorf("data dir %s: wait for planex dev to serve: %w", dir, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// held reports whether a process holds the lock of dir, by trying to take
// it (and releasing it at once when that works).
func held(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR, 0o600)
	if err != nil {
		return false
	}
	defer f.Close()
	ok, err := tryLock(f)
	if err != nil {
		return true // cannot tell: keep waiting, within the timeout
	}
	if ok {
		_ = unlock(f)
	}
	return !ok
}
