// Package reload watches files a server reads at start (certificates, keys,
// an included authorization block) and signals the server to reload them
// when their contents change, like the nats-io Helm chart's config
// reloader does for nats-server.
//
// Kubernetes updates a mounted Secret or ConfigMap by swapping a symlink
// (..data) to a new directory, so an inotify watch on the file itself misses
// the change: the reloader polls a SHA-256 of each file's contents instead.
// It logs the names of the files that changed, never their contents or
// hashes.
package reload

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
)

// DefaultInterval is how often the watched files are read when
// Config.Interval is zero.
const DefaultInterval = 5 * time.Second

// Config is what the reloader watches and whom it signals.
type Config struct {
	// PidFile holds the decimal process id of the server to signal
	// (nats-server writes it with -P or pid_file). It is re-read before
	// every signal, so a restarted server is found again.
	PidFile string
	// Files are the files whose contents trigger a reload when they change.
	Files []string
	// Interval is the polling period; DefaultInterval when zero.
	Interval time.Duration
	// Signal is sent to the server; syscall.SIGHUP when zero.
	Signal syscall.Signal
}

// RegisterFlags adds the reloader's flags to fs.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.PidFile, "pid-file", "/var/run/nats/nats.pid", "file holding the process id of the server to signal (nats-server pid_file)")
	fs.StringSliceVar(&c.Files, "watch", nil, "files whose contents trigger a reload when they change (comma-separated or repeated)")
	fs.DurationVar(&c.Interval, "interval", DefaultInterval, "how often to read the watched files")
}

// Validate reports the first configuration error, naming the flag.
func (c *Config) Validate() error {
	if strings.TrimSpace(c.PidFile) == "" {
		return errors.New("--pid-file: empty; want the server's pid file")
	}
	if len(c.Files) == 0 {
		return errors.New("--watch: no files; want the certificate, key and config files to watch")
	}
	for _, f := range c.Files {
		if strings.TrimSpace(f) == "" {
			return fmt.Errorf("--watch %q: empty file name", strings.Join(c.Files, ","))
		}
	}
	if c.Interval < 0 || (c.Interval > 0 && c.Interval < 100*time.Millisecond) {
		return fmt.Errorf("--interval %s: want at least 100ms", c.Interval)
	}
	return nil
}

// state is one observation of the watched files: the hash of each file's
// contents, or "" when the file could not be read.
type state map[string]string

// changed lists the files whose hash differs between a and b, in the
// order of files.
func changed(files []string, a, b state) []string {
	var out []string
	for _, f := range files {
		if a[f] != b[f] {
			out = append(out, f)
		}
	}
	return out
}

// Reloader polls the watched files and signals the server on a change.
type Reloader struct {
	cfg    Config
	logger *slog.Logger
	// kill sends sig to pid; syscall.Kill outside tests.
	kill func(pid int, sig syscall.Signal) error
}

// New returns a Reloader for cfg, which must be valid.
func New(cfg Config, logger *slog.Logger) (*Reloader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Signal == 0 {
		cfg.Signal = syscall.SIGHUP
	}
	cfg.Files = slices.Clone(cfg.Files)
	return &Reloader{cfg: cfg, logger: logger, kill: syscall.Kill}, nil
}

// read hashes every watched file. A file that cannot be read has hash ""
// and is logged at debug level; its error never carries its contents.
func (r *Reloader) read() state {
	s := make(state, len(r.cfg.Files))
	for _, f := range r.cfg.Files {
		b, err := os.ReadFile(f)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				r.logger.Debug("read watched file", "file", f, "error", err)
			}
			s[f] = ""
			continue
		}
		sum := sha256.Sum256(b)
		s[f] = string(sum[:])
	}
	return s
}

// Run polls until ctx ends. A change is signalled once the files have held
// the same contents for two polls in a row, so a certificate and its key
// written one after the other are reloaded together. When the signal
// cannot be sent (no pid file yet, server restarting) the change stays
// pending and is retried at the next poll. Run returns nil when ctx ends.
func (r *Reloader) Run(ctx context.Context) error {
	applied := r.read()
	seen := applied
	for _, f := range r.cfg.Files {
		if applied[f] == "" {
			r.logger.Warn("watched file not readable at start; a reload follows when it appears", "file", f)
		}
	}
	r.logger.Info("watching files for reload", "files", r.cfg.Files, "pid_file", r.cfg.PidFile, "interval", r.cfg.Interval.String())
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur := r.read()
		settled := len(changed(r.cfg.Files, seen, cur)) == 0
		seen = cur
		diff := changed(r.cfg.Files, applied, cur)
		if !settled || len(diff) == 0 {
			continue
		}
		pid, err := r.signal()
		if err != nil {
			r.logger.Error("reload after file change; retrying at next poll", "files", diff, "error", err)
			continue
		}
		applied = cur
		r.logger.Info("files changed; server signalled to reload", "files", diff, "pid", pid, "signal", r.cfg.Signal.String())
	}
}

// signal reads the pid file and sends the configured signal.
func (r *Reloader) signal() (int, error) {
	b, err := os.ReadFile(r.cfg.PidFile)
	if err != nil {
		return 0, fmt.Errorf("read pid file %s: %w", r.cfg.PidFile, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		// The contents are not quoted: a mistyped --pid-file could name a key.
		return 0, fmt.Errorf("pid file %s: contents are not a process id", r.cfg.PidFile)
	}
	if err := r.kill(pid, r.cfg.Signal); err != nil {
		return 0, fmt.Errorf("signal %s to pid %d: %w", r.cfg.Signal, pid, err)
	}
	return pid, nil
}
