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

// RestoreOptions configure Restore.
type RestoreOptions struct {
	// Dir is the backup directory.
	Dir string
	// Replicas is the replica count of every restored stream; 0 keeps
	// each stream's count in the backup (a backup of a 3-node cluster
	// restores into a single server with Replicas 1).
	Replicas int
	// Replace deletes streams of the backup that exist on the target
	// before restoring them; without it their presence fails the restore
	// before anything is written.
	Replace bool
	// DryRun verifies the backup and checks the target (what exists, what
	// would be replaced) without writing anything.
	DryRun bool
	// Timeout bounds each JetStream API request (default 10 s); the
	// transfer itself is bounded by ctx only.
	Timeout time.Duration
	// OnStream, when set, is called after each stream is restored (or,
	// in a dry run, checked).
	OnStream func(RestoredStream)
}

// RestoredStream is one stream Restore restored (or would restore).
type RestoredStream struct {
	// Name is the stream's name.
	Name string
	// Replicas is its replica count on the target.
	Replicas int
	// Messages and LastSeq are its state on the target after the restore
	// (in a dry run: in the backup).
	Messages uint64
	LastSeq  uint64
	// Expired is how many of the backup's messages the stream's max age
	// removed on restore (a backup older than the stream keeps them).
	Expired uint64
	// Consumers is how many consumers it has after the restore.
	Consumers int
	// Replaced is true when a stream of that name was deleted first.
	Replaced bool
}

// RestoreResult is what Restore did.
type RestoreResult struct {
	// Manifest is the verified backup's manifest.
	Manifest *Manifest
	// Streams are the restored streams, in the backup's order.
	Streams []RestoredStream
}

// ErrExists is wrapped when streams of the backup exist on the target and
// RestoreOptions.Replace is not set.
var ErrExists = errors.New("streams exist on the target")

// Restore verifies the backup in opts.Dir (Verify), checks that none of
// its streams exists on the target (or, with Replace, deletes those that
// do) and restores every stream, with its consumers, in the backup's
// order. It fails before writing anything when the backup does not verify
// or a stream exists without Replace, and otherwise names the stream that
// failed. With DryRun it stops after the checks.
func Restore(ctx context.Context, nc *nats.Conn, opts RestoreOptions) (*RestoreResult, error) {
	if opts.Replicas < 0 || opts.Replicas > 5 {
		return nil, fmt.Errorf("replicas %d: want 1 to 5, or 0 for the backup's", opts.Replicas)
	}
	m, err := Verify(opts.Dir)
	if err != nil {
		return nil, err
	}
	mgr, err := manager(nc, opts.Timeout)
	if err != nil {
		return nil, err
	}
	existing := map[string]bool{}
	var present []string
	for _, s := range m.Streams {
		known, err := mgr.IsKnownStream(s.Name)
		if err != nil {
			return nil, fmt.Errorf("look up stream %s on the target: %w", s.Name, err)
		}
		if !known {
			continue
		}
		existing[s.Name] = true
		desc := s.Name
		if str, err := mgr.LoadStream(s.Name); err == nil {
			if st, err := str.State(); err == nil {
				desc = fmt.Sprintf("%s (%d messages)", s.Name, st.Msgs)
			}
		}
		present = append(present, desc)
	}
	if len(present) > 0 && !opts.Replace {
		return nil, fmt.Errorf("%w: %s; a restore never overwrites them: restore into a NATS without planex's streams (start the planex services after the restore), or pass --replace to delete these and restore the backup's", ErrExists, strings.Join(present, ", "))
	}
	res := &RestoreResult{Manifest: m}
	for _, s := range m.Streams {
		replicas := s.Replicas
		if opts.Replicas > 0 {
			replicas = opts.Replicas
		}
		rs := RestoredStream{Name: s.Name, Replicas: replicas, Messages: s.Messages, LastSeq: s.LastSeq, Consumers: s.Consumers, Replaced: existing[s.Name]}
		if !opts.DryRun {
			if rs, err = restoreStream(ctx, mgr, opts.Dir, s, replicas, existing[s.Name], apiTimeout(opts.Timeout)); err != nil {
				return res, fmt.Errorf("restore stream %s: %w", s.Name, err)
			}
		}
		res.Streams = append(res.Streams, rs)
		if opts.OnStream != nil {
			opts.OnStream(rs)
		}
	}
	return res, nil
}

// restoreStream restores one stream with the given replica count,
// deleting the target's stream of that name first when replace is set.
func restoreStream(ctx context.Context, mgr *jsm.Manager, dir string, s StreamBackup, replicas int, replace bool, timeout time.Duration) (RestoredStream, error) {
	rs := RestoredStream{Name: s.Name, Replicas: replicas, Replaced: replace}
	if replace {
		if err := mgr.DeleteStream(s.Name); err != nil {
			return rs, fmt.Errorf("delete the existing stream: %w", err)
		}
	}
	meta, err := readMeta(filepath.Join(dir, s.Dir))
	if err != nil {
		return rs, err
	}
	cfg := meta.Config
	cfg.Replicas = replicas
	state, err := restoreArchive(ctx, mgr.NatsConn(), filepath.Join(dir, s.Dir), api.JSApiStreamRestoreRequest{Config: cfg, State: meta.State}, timeout)
	if err != nil {
		return rs, err
	}
	rs.Messages, rs.LastSeq, rs.Consumers = state.Msgs, state.LastSeq, state.Consumers
	if state.LastSeq < s.LastSeq || state.Msgs > s.Messages {
		return rs, fmt.Errorf("restored %d messages up to sequence %d, the backup holds %d up to %d", state.Msgs, state.LastSeq, s.Messages, s.LastSeq)
	}
	if state.Msgs < s.Messages {
		if cfg.MaxAge <= 0 {
			return rs, fmt.Errorf("restored %d messages, the backup holds %d", state.Msgs, s.Messages)
		}
		// Messages keep their time: those older than the stream's max age
		// are gone at once, as they would have been had it run on.
		rs.Expired = s.Messages - state.Msgs
	}
	return rs, nil
}

// restoreArchive sends a stream's archive to the server with the
// JetStream restore protocol, as jsm.go's RestoreSnapshotFromDirectory
// does (request $JS.API.STREAM.RESTORE.<stream>, then the archive in
// chunks, each a request to the subject the server answered with, then an
// empty chunk whose answer is the created stream), with one difference:
// a chunk that finds no responder is sent again. In a cluster the node
// that receives the chunks subscribes once it has answered, and the
// subscription may not have reached the node the client is connected to
// when the first chunk goes out; jsm.go then fails the restore, and the
// server keeps the half-created stream until its restore stalls.
func restoreArchive(ctx context.Context, nc *nats.Conn, dir string, req api.JSApiStreamRestoreRequest, timeout time.Duration) (*api.StreamState, error) {
	path, err := jsm.SnapshotDataPath(dir)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode restore request: %w", err)
	}
	resp, err := startRestore(ctx, nc, req.Config.Name, body, timeout)
	if err != nil {
		return nil, err
	}
	chunk := make([]byte, min(restoreChunk, int(nc.MaxPayload())))
	for {
		n, err := f.Read(chunk)
		if n > 0 {
			if _, err := sendChunk(ctx, nc, resp.DeliverSubject, chunk[:n], timeout); err != nil {
				return nil, err
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
	// The server restores once it has the whole archive: a long wait.
	final, err := sendChunk(ctx, nc, resp.DeliverSubject, nil, time.Hour)
	if err != nil {
		return nil, err
	}
	var created api.JSApiStreamCreateResponse
	if err := json.Unmarshal(final.Data, &created); err != nil {
		return nil, fmt.Errorf("restore answer: %w", err)
	}
	if created.IsError() {
		return nil, created.ToError()
	}
	if created.StreamInfo == nil {
		return nil, errors.New("restore answer: no stream")
	}
	return &created.State, nil
}

// placementWait bounds how long a restore request refused for want of
// peers is sent again. A cluster's meta leader counts a node offline
// when it missed its statistics heartbeats for a while (a node just
// started, or one on a loaded machine); it comes back within seconds.
var placementWait = 30 * time.Second

// errCodeNoPeers is JetStream's error code for "no suitable peers for
// placement" (nats-server's JSClusterNoPeersErrF).
const errCodeNoPeers = 10005

// testHookPlacementRefused, when set by a test, is called each time a
// restore request was refused for want of peers and will be sent again.
var testHookPlacementRefused func(stream string)

// startRestore asks the server to restore the stream and returns its
// answer (the subject the archive goes to). A refusal because no
// suitable peers are online (10005) is asked again for up to
// placementWait: the server creates nothing before it has placed the
// stream, so asking again is safe.
func startRestore(ctx context.Context, nc *nats.Conn, stream string, body []byte, timeout time.Duration) (*api.JSApiStreamRestoreResponse, error) {
	deadline := time.Now().Add(placementWait)
	for {
		msg, err := request(ctx, nc, fmt.Sprintf(api.JSApiStreamRestoreT, stream), body, timeout)
		if err != nil {
			return nil, fmt.Errorf("restore request: %w", err)
		}
		var resp api.JSApiStreamRestoreResponse
		if err := json.Unmarshal(msg.Data, &resp); err != nil {
			return nil, fmt.Errorf("restore request: %w", err)
		}
		if !resp.IsError() {
			return &resp, nil
		}
		if resp.Error.ErrCode != errCodeNoPeers || time.Now().After(deadline) {
			return nil, fmt.Errorf("restore request: %w", resp.ToError())
		}
		if testHookPlacementRefused != nil {
			testHookPlacementRefused(stream)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("restore request: %w (last refusal: %v)", ctx.Err(), resp.ToError())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// restoreChunk is the size of the chunks sent (jsm.go's).
const restoreChunk = 64 * 1024

// sendChunk sends one chunk of a restore and returns the server's answer,
// sending it again while no responder takes it (for up to 10 s).
func sendChunk(ctx context.Context, nc *nats.Conn, subject string, data []byte, timeout time.Duration) (*nats.Msg, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		msg, err := request(ctx, nc, subject, data, timeout)
		if errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("send archive: %w", err)
		}
		if jsm.IsErrorResponse(msg) {
			return nil, fmt.Errorf("send archive: %w", jsm.ParseErrorResponse(msg))
		}
		return msg, nil
	}
}

// request is a NATS request bounded by ctx and d.
func request(ctx context.Context, nc *nats.Conn, subject string, data []byte, d time.Duration) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return nc.RequestWithContext(ctx, subject, data)
}
