package mcppool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Backoff bounds of server restarts.
const (
	minRestartDelay = 200 * time.Millisecond
	maxRestartDelay = 30 * time.Second
)

// server keeps one MCP client session alive: it starts (or dials) the
// server, and when the session ends it reconnects with exponential
// backoff until the pool closes.
type server struct {
	name           string // as configured
	id             string // as used in tool names
	cfg            ServerConfig
	mask           *mask // expanded values, printed as their variable's name
	logger         *slog.Logger
	onList         func(ctx context.Context, s *server) // tools/list_changed
	onHealth       func(server string, err error)
	connectTimeout time.Duration // initialize handshake, including a package download by npx

	mu       sync.Mutex
	session  *mcp.ClientSession
	lastErr  error
	ready    chan struct{} // closed once the first connection attempt ended
	readyOK  bool
	restarts int
	proc     *exec.Cmd // stdio server process of the latest attempt
}

// minimalEnv is the environment a stdio server starts with before the
// configured env: nothing of the executor's secrets (NATS credentials,
// SMTP passwords) leaks into a third-party process.
func minimalEnv(extra map[string]string) []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "LANG", "TMPDIR", "TZ"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// transport builds a fresh transport for one connection attempt.
func (s *server) transport() (mcp.Transport, error) {
	if s.cfg.URL != "" {
		headers := http.Header{}
		for k, v := range s.cfg.Headers {
			headers.Set(k, v)
		}
		if f := s.cfg.BearerTokenFile; f != "" {
			tok, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("bearerTokenFile: %w", err)
			}
			tok = []byte(strings.TrimSpace(string(tok)))
			s.mask.add("[bearerTokenFile]", string(tok))
			headers.Set("Authorization", "Bearer "+string(tok))
		}
		return &mcp.StreamableClientTransport{
			Endpoint:   s.cfg.URL,
			HTTPClient: &http.Client{Transport: headerTransport{headers: headers, base: http.DefaultTransport}},
			MaxRetries: 1,
		}, nil
	}
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	cmd.Env = minimalEnv(s.cfg.Env)
	cmd.Dir = s.cfg.Cwd
	cmd.Stderr = &logWriter{logger: s.logger, mask: s.mask}
	s.mu.Lock()
	s.proc = cmd
	s.mu.Unlock()
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil
}

// headerTransport adds the configured headers to every request.
type headerTransport struct {
	headers http.Header
	base    http.RoundTripper
}

func (h headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range h.headers {
		req.Header[k] = v
	}
	return h.base.RoundTrip(req)
}

// logWriter turns a server's stderr into log lines, masking expanded
// values (a server may print its command line or its token).
type logWriter struct {
	logger *slog.Logger
	mask   *mask
	mu     sync.Mutex
	buf    []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			if len(w.buf) > 8<<10 {
				w.logger.Info("mcp server stderr", "line", w.mask.String(string(w.buf)))
				w.buf = w.buf[:0]
			}
			return len(p), nil
		}
		if line := strings.TrimRight(string(w.buf[:i]), "\r"); line != "" {
			w.logger.Info("mcp server stderr", "line", w.mask.String(line))
		}
		w.buf = w.buf[i+1:]
	}
}

var _ io.Writer = (*logWriter)(nil)

// connect opens one session. Its error never holds an expanded value: the
// SDK's errors embed the URL, exec's the command.
func (s *server) connect(ctx context.Context) (*mcp.ClientSession, error) {
	cs, err := s.dial(ctx)
	return cs, s.mask.Error(err)
}

func (s *server) dial(ctx context.Context) (*mcp.ClientSession, error) {
	t, err := s.transport()
	if err != nil {
		return nil, err
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "planex-executor-mcp", Version: "v1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ToolListChangedHandler: func(ctx context.Context, _ *mcp.ToolListChangedRequest) {
			if s.onList != nil {
				go s.onList(context.WithoutCancel(ctx), s)
			}
		},
	})
	cctx, cancel := context.WithTimeout(ctx, s.connectTimeout)
	defer cancel()
	return client.Connect(cctx, t, nil)
}

// supervise keeps the session alive until ctx ends.
func (s *server) supervise(ctx context.Context, connected func(context.Context, *mcp.ClientSession)) {
	delay := minRestartDelay
	first := true
	for ctx.Err() == nil {
		started := time.Now()
		cs, err := s.connect(ctx)
		if err == nil {
			connected(ctx, cs)
		}
		s.mu.Lock()
		s.session, s.lastErr = cs, err
		if first {
			s.readyOK = err == nil
			close(s.ready)
			first = false
		}
		s.mu.Unlock()
		if s.onHealth != nil {
			s.onHealth(s.name, err)
		}
		if err == nil {
			s.logger.Info("mcp server connected")
			waitErr := make(chan error, 1)
			go func() { waitErr <- s.mask.Error(cs.Wait()) }()
			select {
			case <-ctx.Done():
				_ = cs.Close()
				<-waitErr
				return
			case err = <-waitErr:
			}
			if err == nil {
				err = errors.New("session closed")
			}
			s.mu.Lock()
			s.session, s.lastErr = nil, err
			s.restarts++
			s.mu.Unlock()
			if s.onHealth != nil {
				s.onHealth(s.name, err)
			}
			if time.Since(started) > maxRestartDelay {
				delay = minRestartDelay // it ran well for a while
			}
		}
		if ctx.Err() != nil {
			return
		}
		s.logger.Warn("mcp server down; reconnecting", "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, maxRestartDelay)
	}
}

// current returns the live session or the reason there is none.
func (s *server) current() (*mcp.ClientSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session != nil {
		return s.session, nil
	}
	if s.lastErr != nil {
		return nil, s.lastErr
	}
	return nil, errors.New("not connected yet")
}

// broken drops cs after a call found its transport dead, so Health and the
// next calls see the server down at once instead of when the supervisor
// notices; closing cs wakes the supervisor to restart it.
func (s *server) broken(cs *mcp.ClientSession, cause error) {
	s.mu.Lock()
	if s.session == cs {
		s.session, s.lastErr = nil, cause
	}
	s.mu.Unlock()
	go func() { _ = cs.Close() }()
}
