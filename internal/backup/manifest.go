package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
)

// ManifestFile is the manifest's name in a backup directory. It is written
// last, once every stream is in: a directory without it is no backup.
const ManifestFile = "backup.json"

// Format is the manifest format this package writes and reads.
const Format = 1

// streamsDir holds one directory per stream, each as `nats stream backup`
// writes it (jsm.go's SnapshotToDirectory: backup.json with the stream's
// configuration and state, and the archive), so `nats stream restore
// DIR/streams/<name>` reads it too.
const streamsDir = "streams"

// Manifest describes a backup: what planex and NATS it was taken from,
// when, and each stream with its files' checksums.
type Manifest struct {
	// Format is the manifest format (Format).
	Format int `json:"format"`
	// PlanexVersion is the version of the planex that took it.
	PlanexVersion string `json:"planex_version"`
	// ServerVersion is the NATS server version it was taken from.
	ServerVersion string `json:"server_version,omitempty"`
	// Started and Finished bound the time the snapshots were taken in.
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Streams are the streams, in the order they were taken (and are
	// restored).
	Streams []StreamBackup `json:"streams"`
}

// StreamBackup is one stream in a backup.
type StreamBackup struct {
	Stream
	// Dir is the stream's directory, relative to the backup's.
	Dir string `json:"dir"`
	// Replicas is the stream's replica count where it was taken.
	Replicas int `json:"replicas"`
	// Config is the stream's configuration as the server reported it.
	Config api.StreamConfig `json:"config"`
	// Messages, Bytes, FirstSeq and LastSeq are its state at the snapshot.
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// Consumers is how many consumers the snapshot holds.
	Consumers int `json:"consumers"`
	// TakenAt is when its snapshot finished.
	TakenAt time.Time `json:"taken_at"`
	// Files are the stream directory's files with their size and SHA-256.
	Files []File `json:"files"`
}

// File is one file of a stream's backup.
type File struct {
	// Name is the file's name in the stream's directory.
	Name string `json:"name"`
	// Size is its size in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex SHA-256 of its content.
	SHA256 string `json:"sha256"`
}

// ErrCorrupt is wrapped by Verify's errors about a backup's content: a
// file missing, of another size or checksum than the manifest says, or a
// manifest that does not read.
var ErrCorrupt = errors.New("backup is corrupt")

// Verify checks a backup directory without touching NATS: the manifest
// reads and is of a known format, and every file it lists is there with
// its size and SHA-256. The error names the first file at fault.
func Verify(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w: no manifest (a backup that did not finish writes none)", path, ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrCorrupt, err)
	}
	if m.Format != Format {
		return nil, fmt.Errorf("%s: format %d, this planex reads format %d", path, m.Format, Format)
	}
	if len(m.Streams) == 0 {
		return nil, fmt.Errorf("%s: %w: it lists no stream", path, ErrCorrupt)
	}
	for _, s := range m.Streams {
		if err := verifyStream(dir, s); err != nil {
			return nil, err
		}
	}
	return &m, nil
}

func verifyStream(dir string, s StreamBackup) error {
	if s.Name == "" || s.Config.Name != s.Name {
		return fmt.Errorf("%s: %w: stream %q has configuration of %q", filepath.Join(dir, ManifestFile), ErrCorrupt, s.Name, s.Config.Name)
	}
	if s.Dir != filepath.Join(streamsDir, s.Name) {
		return fmt.Errorf("%s: %w: stream %s in directory %q", filepath.Join(dir, ManifestFile), ErrCorrupt, s.Name, s.Dir)
	}
	names := make([]string, 0, len(s.Files))
	for _, f := range s.Files {
		names = append(names, f.Name)
		path := filepath.Join(dir, s.Dir, f.Name)
		if f.Name != filepath.Base(f.Name) {
			return fmt.Errorf("%s: %w: file name %q", filepath.Join(dir, ManifestFile), ErrCorrupt, f.Name)
		}
		size, sum, err := checksum(path)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: %w: missing (stream %s)", path, ErrCorrupt, s.Name)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if size != f.Size {
			return fmt.Errorf("%s: %w: %d bytes, the manifest says %d (stream %s)", path, ErrCorrupt, size, f.Size, s.Name)
		}
		if sum != f.SHA256 {
			return fmt.Errorf("%s: %w: SHA-256 %s, the manifest says %s (stream %s)", path, ErrCorrupt, sum, f.SHA256, s.Name)
		}
	}
	// The archive and its metadata must both be listed: a manifest that
	// lost one would restore nothing, or another stream's data.
	if !slices.Contains(names, jsm.SnapshotMetaFile) || !(slices.Contains(names, jsm.SnapshotDataFile) || slices.Contains(names, jsm.SnapshotLegacyDataFile)) {
		return fmt.Errorf("%s: %w: stream %s lists %v, want %s and its archive", filepath.Join(dir, ManifestFile), ErrCorrupt, s.Name, names, jsm.SnapshotMetaFile)
	}
	return nil
}

// checksum returns a file's size and hex SHA-256.
func checksum(path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// fileList lists a stream directory's files with their checksums.
func fileList(dir string) ([]File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []File
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		size, sum, err := checksum(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: e.Name(), Size: size, SHA256: sum})
	}
	return files, nil
}
