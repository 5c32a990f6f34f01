// Package backup takes and restores backups of planex's state in NATS
// JetStream: the run logs, engine inbox and step queues, run snapshots,
// idempotency keys, stored outputs, tool floors, step replay cache, email
// drafts and side-effect records (see Streams). Each stream is snapshotted
// with the JetStream snapshot API through jsm.go — what `nats stream
// backup` uses — with its consumers, into a directory per stream; a
// manifest (ManifestFile) written last lists every stream with its
// configuration, state and file checksums. Restore checks the manifest
// and checksums first, refuses to overwrite streams that exist unless told
// to replace them, and restores with the target cluster's replica count.
package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
)

// Options configure Backup.
type Options struct {
	// Dir is the directory the backup is written to. It must not exist or
	// be empty: a backup never mixes with another.
	Dir string
	// PlanexVersion is recorded in the manifest.
	PlanexVersion string
	// Check asks the server to check each stream's stored messages
	// before its snapshot (the `--check` of `nats stream backup`).
	Check bool
	// Timeout bounds each JetStream API request (default 10 s); the
	// snapshot transfer itself is bounded by ctx only.
	Timeout time.Duration
	// OnStream, when set, is called after each stream is written.
	OnStream func(StreamBackup)
}

// ErrNotEmpty is returned by Backup for a directory that holds anything.
var ErrNotEmpty = errors.New("directory is not empty")

// Backup snapshots every planex stream that exists (Streams, the output
// buckets, TailStreams; Skipped ones are left out) into opts.Dir and then
// writes the manifest. It fails, naming the stream, when a required stream
// is missing or any snapshot fails; the directory then has no manifest
// and Verify refuses it.
func Backup(ctx context.Context, nc *nats.Conn, opts Options) (*Manifest, error) {
	if opts.Dir == "" {
		return nil, errors.New("backup directory: empty")
	}
	if err := prepareDir(opts.Dir); err != nil {
		return nil, err
	}
	mgr, err := manager(nc, opts.Timeout)
	if err != nil {
		return nil, err
	}
	names, err := mgr.StreamNames(nil)
	if err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	streams, missing, unknown := plan(names)
	if len(missing) > 0 {
		return nil, fmt.Errorf("streams %s do not exist on this NATS: no planex supervisor has set it up, or this is another account or server", strings.Join(missing, ", "))
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("streams %s are named like planex's but this planex %s does not know them (a newer release's?): back up with the planex release that runs this installation, or with nats stream backup", strings.Join(unknown, ", "), orUnknown(opts.PlanexVersion))
	}
	m := &Manifest{Format: Format, PlanexVersion: opts.PlanexVersion, ServerVersion: nc.ConnectedServerVersion(), Started: time.Now().UTC()}
	for _, s := range streams {
		sb, err := snapshot(ctx, mgr, opts, s)
		if err != nil {
			return nil, fmt.Errorf("back up stream %s: %w (the backup in %s is incomplete: it has no %s)", s.Name, err, opts.Dir, ManifestFile)
		}
		m.Streams = append(m.Streams, sb)
		if opts.OnStream != nil {
			opts.OnStream(sb)
		}
	}
	m.Finished = time.Now().UTC()
	if err := writeManifest(opts.Dir, m); err != nil {
		return nil, err
	}
	return m, nil
}

// snapshot writes one stream's snapshot with its consumers into
// <dir>/streams/<name> and describes it.
func snapshot(ctx context.Context, mgr *jsm.Manager, opts Options, s Stream) (StreamBackup, error) {
	str, err := mgr.LoadStream(s.Name)
	if err != nil {
		return StreamBackup{}, fmt.Errorf("look up: %w", err)
	}
	rel := filepath.Join(streamsDir, s.Name)
	dir := filepath.Join(opts.Dir, rel)
	sopts := []jsm.SnapshotOption{jsm.SnapshotConsumers()}
	if opts.Check {
		sopts = append(sopts, jsm.SnapshotHealthCheck())
	}
	if _, err := str.SnapshotToDirectory(ctx, dir, sopts...); err != nil {
		return StreamBackup{}, fmt.Errorf("snapshot: %w", err)
	}
	meta, err := readMeta(dir)
	if err != nil {
		return StreamBackup{}, err
	}
	if meta.Config.Name != s.Name {
		return StreamBackup{}, fmt.Errorf("snapshot: the server sent stream %q", meta.Config.Name)
	}
	files, err := fileList(dir)
	if err != nil {
		return StreamBackup{}, fmt.Errorf("checksum: %w", err)
	}
	return StreamBackup{
		Stream: s, Dir: rel, Replicas: max(meta.Config.Replicas, 1), Config: meta.Config,
		Messages: meta.State.Msgs, Bytes: meta.State.Bytes, FirstSeq: meta.State.FirstSeq, LastSeq: meta.State.LastSeq,
		Consumers: meta.State.Consumers, TakenAt: time.Now().UTC(), Files: files,
	}, nil
}

// streamMeta is the metadata file jsm.go writes beside a stream's archive
// (and reads back to restore it).
type streamMeta struct {
	Config api.StreamConfig `json:"config"`
	State  api.StreamState  `json:"state"`
}

func readMeta(dir string) (*streamMeta, error) {
	path := filepath.Join(dir, jsm.SnapshotMetaFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var meta streamMeta
	if err := json.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrCorrupt, err)
	}
	return &meta, nil
}

// prepareDir creates dir (0700: a backup holds everything planex stores)
// or accepts an existing empty one.
func prepareDir(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create backup directory: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("backup directory: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.IsDir() {
		return fmt.Errorf("backup directory %s: not a directory", dir)
	}
	if _, err := f.Readdirnames(1); !errors.Is(err, io.EOF) {
		return fmt.Errorf("backup directory %s: %w: a backup is written into a new or empty directory only", dir, ErrNotEmpty)
	}
	return nil
}

// writeManifest writes the manifest atomically (a temporary file renamed),
// so a manifest that is there is whole.
func writeManifest(dir string, m *Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	tmp := filepath.Join(dir, "."+ManifestFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ManifestFile)); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// manager is jsm.go's JetStream manager on nc.
func manager(nc *nats.Conn, timeout time.Duration) (*jsm.Manager, error) {
	mgr, err := jsm.New(nc, jsm.WithTimeout(apiTimeout(timeout)))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return mgr, nil
}

// apiTimeout is a JetStream API request's timeout: d, or 10 s.
func apiTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return 10 * time.Second
	}
	return d
}

func orUnknown(v string) string {
	if v == "" {
		return "(version unknown)"
	}
	return v
}
