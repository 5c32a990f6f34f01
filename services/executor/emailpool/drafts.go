package emailpool

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// Draft is a stored message awaiting email.send.
type Draft struct {
	// ID is the draft id ("d-" and 24 hex digits).
	ID string `json:"id"`
	// To and Cc are the recipients' bare addresses.
	To []string `json:"to"`
	Cc []string `json:"cc,omitempty"`
	// Subject and Body (text/plain) of the message.
	Subject string `json:"subject"`
	Body    string `json:"body"`
	// CreatedAt is when email.draft wrote it.
	CreatedAt time.Time `json:"created_at"`
	// RunID and StepID name the step that wrote it.
	RunID  string `json:"run_id"`
	StepID string `json:"step_id"`
	// SentAt and MessageID are set once the draft was sent.
	SentAt    *time.Time `json:"sent_at,omitempty"`
	MessageID string     `json:"message_id,omitempty"`
}

var draftIDRE = regexp.MustCompile(`^d-[0-9a-f]{24}$`)

// errNoDraft is returned for an unknown draft id.
var errNoDraft = errors.New("no such draft")

// draftStore keeps drafts as JSON files in one directory.
type draftStore struct{ dir string }

func (s *draftStore) path(id string) string { return filepath.Join(s.dir, id+".json") }

// get reads a draft; the id must be well formed.
func (s *draftStore) get(id string) (*Draft, error) {
	if !draftIDRE.MatchString(id) {
		return nil, errNoDraft
	}
	data, err := os.ReadFile(s.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoDraft
	}
	if err != nil {
		return nil, fmt.Errorf("read draft %s: %w", id, err)
	}
	var d Draft
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("decode draft %s: %w", id, err)
	}
	return &d, nil
}

// put writes a draft atomically.
func (s *draftStore) put(d *Draft) error {
	data, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return fmt.Errorf("encode draft %s: %w", d.ID, err)
	}
	return writeAtomic(s.path(d.ID), data)
}

// writeAtomic writes data to path through a synced temporary file and a
// rename, so readers see the old file or the new one, never a torn one.
func writeAtomic(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
