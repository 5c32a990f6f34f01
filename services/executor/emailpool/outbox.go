package emailpool

import (
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net/mail"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// OutboxMessage describes one message in a dev outbox.
type OutboxMessage struct {
	// Path of the .eml file.
	Path string
	// MessageID with angle brackets.
	MessageID string
	// From, To and Cc as in the headers.
	From string
	To   []string
	Cc   []string
	// Subject, decoded.
	Subject string
	// Date from the Date header.
	Date time.Time
	// Size of the file in bytes.
	Size int64
}

func (p *Pool) outboxPath(name string) string { return filepath.Join(p.cfg.OutboxDir, name) }

// ListOutbox lists the messages email.send wrote into a dev outbox
// directory, oldest first. A missing directory holds no messages.
func ListOutbox(dir string) ([]OutboxMessage, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list outbox %s: %w", dir, err)
	}
	var out []OutboxMessage
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".eml") {
			continue
		}
		m, err := readOutboxMessage(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Date.Equal(out[j].Date) {
			return out[i].Date.Before(out[j].Date)
		}
		return out[i].Path < out[j].Path
	})
	return out, nil
}

func readOutboxMessage(path string) (OutboxMessage, error) {
	f, err := os.Open(path)
	if err != nil {
		return OutboxMessage{}, fmt.Errorf("read outbox message %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return OutboxMessage{}, fmt.Errorf("read outbox message %s: %w", path, err)
	}
	msg, err := mail.ReadMessage(f)
	if err != nil {
		return OutboxMessage{}, fmt.Errorf("parse outbox message %s: %w", path, err)
	}
	h := msg.Header
	dec := new(mime.WordDecoder)
	subject, err := dec.DecodeHeader(h.Get("Subject"))
	if err != nil {
		subject = h.Get("Subject")
	}
	m := OutboxMessage{Path: path, MessageID: h.Get("Message-Id"), From: h.Get("From"), Subject: subject, Size: st.Size()}
	m.Date, _ = h.Date()
	m.To = addressList(h, "To")
	m.Cc = addressList(h, "Cc")
	return m, nil
}

func addressList(h mail.Header, key string) []string {
	list, err := h.AddressList(key)
	if err != nil {
		if v := h.Get(key); v != "" {
			return []string{v}
		}
		return nil
	}
	out := make([]string, len(list))
	for i, a := range list {
		out[i] = a.Address
	}
	return out
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
