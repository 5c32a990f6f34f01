package conformance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/stepsign"
)

// Settings the suite gives the executor under test.
const (
	ackWait    = time.Second
	maxDeliver = 5
	grace      = 10 * time.Second
	// wait bounds every condition the suite waits for.
	wait = 30 * time.Second
)

// suite is one executor under test and the supervisor side the suite
// plays: an embedded JetStream server with planex's streams and buckets,
// the step-signing keys, the record file and the executor process.
type suite struct {
	t          *testing.T
	root       string
	command    []string
	nats       *natstest.Server
	nc         *nats.Conn
	res        *bus.Resources
	signer     *stepsign.Signer
	stranger   *stepsign.Signer // a key the executor does not trust
	keysDir    string
	recordFile string

	mu         sync.Mutex
	terminated map[string]bool // "<stream>:<seq>" of MSG_TERMINATED advisories

	proc  *process
	stale map[string]bool // replica ids of executor processes that are gone
}

// process is one start of the executor under test.
type process struct {
	cmd     *exec.Cmd
	out     *syncBuffer
	done    chan struct{}
	err     error // cmd.Wait's, once done is closed
	replica string
}

// syncBuffer collects the executor's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newSuite(t *testing.T, root string, command []string) *suite {
	t.Helper()
	s := &suite{t: t, root: root, command: command, terminated: map[string]bool{}, stale: map[string]bool{}}
	s.nats = natstest.Start(t)
	s.nc, s.res = s.nats.Setup(t)

	dir := t.TempDir()
	s.keysDir = filepath.Join(dir, "keys")
	if _, err := stepsign.GenerateKeyFiles(filepath.Join(dir, "signing.pem"), s.keysDir); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.signer, err = stepsign.LoadSigner(filepath.Join(dir, "signing.pem")); err != nil {
		t.Fatal(err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s.stranger = stepsign.NewSigner(priv)
	s.recordFile = filepath.Join(dir, "executions.jsonl")

	sub, err := s.nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>", func(m *nats.Msg) {
		var a struct {
			Stream    string `json:"stream"`
			StreamSeq uint64 `json:"stream_seq"`
		}
		if json.Unmarshal(m.Data, &a) == nil {
			s.mu.Lock()
			s.terminated[a.Stream+":"+strconv.FormatUint(a.StreamSeq, 10)] = true
			s.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s.start(t)
	return s
}

// env is the contract's environment (README.md).
func (s *suite) env() []string {
	return append(os.Environ(),
		EnvNATSURL+"="+s.nats.URL(),
		EnvPool+"="+Pool,
		EnvVerifyKeys+"="+s.keysDir,
		EnvRecordFile+"="+s.recordFile,
		EnvAckWaitMS+"="+strconv.Itoa(int(ackWait/time.Millisecond)),
		EnvMaxDeliver+"="+strconv.Itoa(maxDeliver),
		EnvGraceMS+"="+strconv.Itoa(int(grace/time.Millisecond)),
	)
}

// start starts the executor and waits until it registered its tools.
func (s *suite) start(t *testing.T) {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(s.command[0], s.command[1:]...)
	cmd.Dir = s.root
	cmd.Env = s.env()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start executor %q: %v", strings.Join(s.command, " "), err)
	}
	p := &process{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	s.proc = p
	s.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if s.t.Failed() || testing.Verbose() {
			s.t.Logf("executor %s (replica %s) output:\n%s", strings.Join(s.command, " "), p.replica, out.String())
		}
	})
	p.replica = s.waitRegistered(t, p)
}

// waitRegistered waits for a replica, not one of the stale ones, that has
// registered all three tools, and returns its id.
func (s *suite) waitRegistered(t *testing.T, p *process) string {
	t.Helper()
	var last map[string]int
	deadline := time.Now().Add(2 * wait)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			t.Fatalf("executor exited before registering its tools: %v", p.err)
		default:
		}
		last = map[string]int{}
		for _, key := range s.keys(t) {
			tool, replica, err := bus.ParseToolKey(key)
			if err != nil || s.stale[replica] || bus.PoolOf(tool) != Pool {
				continue
			}
			last[replica]++
		}
		for replica, n := range last {
			if n == 3 {
				return replica
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("executor did not register %s, %s and %s within %s (registrations per replica: %v)", ToolEcho, ToolWrite, ToolSlow, 2*wait, last)
	return ""
}

// keys lists planex-tools.
func (s *suite) keys(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := s.res.Tools.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("list %s: %v", bus.BucketTools, err)
	}
	return keys
}

// kill ends the executor with SIGKILL and checks it died of it.
func (s *suite) kill(t *testing.T) {
	t.Helper()
	p := s.proc
	select {
	case <-p.done:
		t.Fatalf("executor exited before the kill: %v", p.err)
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill executor: %v", err)
	}
	<-p.done
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("executor did not die of SIGKILL: %v", p.cmd.ProcessState)
	}
	s.stale[p.replica] = true
}

// terminate sends SIGTERM and waits for the exit within the grace period
// (and some slack); it returns the exit error.
func (s *suite) terminate(t *testing.T) error {
	t.Helper()
	p := s.proc
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM executor: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(grace + wait):
		t.Fatalf("executor still running %s after SIGTERM", grace+wait)
	}
	s.stale[p.replica] = true
	return p.err
}

// newID returns a fresh subject token with prefix.
func newID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// step is a step request of tool with args.
func step(tool string, args map[string]any) *planexv1.StepRequest {
	a, err := structpb.NewStruct(args)
	if err != nil {
		panic(err) // literal test arguments
	}
	return &planexv1.StepRequest{
		RunId: newID("run"), StepId: "s1", Attempt: 1, PlanRevision: 1, Tool: tool, Args: a,
	}
}

// send options; the zero value publishes as the supervisor does.
type send struct {
	// subject overrides where the request goes.
	subject string
	// signer overrides the trusted signer.
	signer *stepsign.Signer
	// expires overrides the signature's expiry (now + 5 minutes).
	expires time.Time
	// noApproval signs a gated tool's step without an approval proof.
	noApproval bool
	// msgID overrides Nats-Msg-Id <run>:<step>:<attempt>.
	msgID string
	// tamper changes the message after it was signed.
	tamper func(m *nats.Msg)
}

// approval is the proof the suite gives a gated step.
func approval(req *planexv1.StepRequest) string {
	return "gate=g-" + req.GetStepId() + ";decision=approve;by=conformance"
}

// subjectFor is where the supervisor would publish a step of tool: the
// pool's request subject on PLANEX_EVENTS when the pool consumes there,
// else planex.steps.<tool>.
func (s *suite) subjectFor(t *testing.T, tool string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := s.res.JS.Consumer(ctx, bus.StreamEvents, bus.PoolConsumer(Pool)); err == nil &&
		c.CachedInfo().Config.FilterSubject == bus.DispatchFilter(Pool) {
		return bus.RequestSubject(Pool)
	}
	return bus.SubjectStepsPrefix + tool
}

// publish signs and publishes req; it returns the message as published
// and the stream and sequence that stored it.
func (s *suite) publish(t *testing.T, req *planexv1.StepRequest, o send) (*nats.Msg, *jetstream.PubAck) {
	t.Helper()
	subject := o.subject
	if subject == "" {
		subject = s.subjectFor(t, req.GetTool())
	}
	data, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	signer := s.signer
	if o.signer != nil {
		signer = o.signer
	}
	expires := o.expires
	if expires.IsZero() {
		expires = time.Now().Add(5 * time.Minute)
	}
	proof := ""
	if req.GetTool() != ToolEcho && req.GetTool() != ToolSlow && !o.noApproval {
		proof = approval(req) // conf.write, and tools the pool does not have
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header = signer.Sign(subject, data, expires, proof)
	msgID := o.msgID
	if msgID == "" {
		msgID = bus.MsgID(req.GetRunId(), req.GetStepId(), strconv.Itoa(int(req.GetAttempt())))
	}
	m.Header.Set(nats.MsgIdHdr, msgID)
	m.Header.Set(bus.HeaderContentType, string(req.ProtoReflect().Descriptor().FullName()))
	if o.tamper != nil {
		o.tamper(m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := s.res.JS.PublishMsg(ctx, m)
	if err != nil {
		t.Fatalf("publish step request on %s: %v", subject, err)
	}
	if ack.Duplicate {
		t.Fatalf("step request %s on %s was dropped as a duplicate", msgID, subject)
	}
	return m, ack
}

// republish publishes the same bytes and headers again under msgID.
func (s *suite) republish(t *testing.T, m *nats.Msg, msgID string) *jetstream.PubAck {
	t.Helper()
	again := nats.NewMsg(m.Subject)
	again.Data = m.Data
	for k, vs := range m.Header {
		again.Header[k] = append([]string(nil), vs...)
	}
	again.Header.Set(nats.MsgIdHdr, msgID)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := s.res.JS.PublishMsg(ctx, again)
	if err != nil {
		t.Fatalf("republish step request: %v", err)
	}
	return ack
}

// watcher collects what executors publish about one run on
// planex.engine.<run>.>, as core NATS messages: it sees a result that
// JetStream deduplicates as well (a replayed result has the message id
// of the first).
type watcher struct {
	sub  *nats.Subscription
	mu   sync.Mutex
	msgs []*nats.Msg
}

// watch starts watching run; call it before publishing the step.
func (s *suite) watch(t *testing.T, run string) *watcher {
	t.Helper()
	w := &watcher{}
	sub, err := s.nc.Subscribe(bus.SubjectEnginePrefix+run+".>", func(m *nats.Msg) {
		w.mu.Lock()
		w.msgs = append(w.msgs, m)
		w.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	w.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

// snapshot returns the messages seen so far.
func (w *watcher) snapshot() []*nats.Msg {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*nats.Msg(nil), w.msgs...)
}

// results decodes the results seen so far.
func (w *watcher) results(t *testing.T) ([]*planexv1.StepResult, []*nats.Msg) {
	t.Helper()
	var out []*planexv1.StepResult
	var msgs []*nats.Msg
	for _, m := range w.snapshot() {
		if !strings.HasSuffix(m.Subject, "."+bus.KindResult) {
			continue
		}
		r := &planexv1.StepResult{}
		if err := proto.Unmarshal(m.Data, r); err != nil {
			t.Fatalf("result on %s does not decode as planex.v1.StepResult: %v", m.Subject, err)
		}
		out, msgs = append(out, r), append(msgs, m)
	}
	return out, msgs
}

// notices decodes the started notices and heartbeats seen so far.
func (w *watcher) notices(t *testing.T) ([]*planexv1.StepStartedNotice, []*nats.Msg) {
	t.Helper()
	var out []*planexv1.StepStartedNotice
	var msgs []*nats.Msg
	for _, m := range w.snapshot() {
		if !strings.HasSuffix(m.Subject, "."+bus.KindStarted) {
			continue
		}
		n := &planexv1.StepStartedNotice{}
		if err := proto.Unmarshal(m.Data, n); err != nil {
			t.Fatalf("notice on %s does not decode as planex.v1.StepStartedNotice: %v", m.Subject, err)
		}
		out, msgs = append(out, n), append(msgs, m)
	}
	return out, msgs
}

// nthResult waits for the n-th (1-based) result.
func (w *watcher) nthResult(t *testing.T, n int) (*planexv1.StepResult, *nats.Msg) {
	t.Helper()
	var rs []*planexv1.StepResult
	var ms []*nats.Msg
	waitFor(t, fmt.Sprintf("result #%d on %s", n, w.sub.Subject), func() bool {
		rs, ms = w.results(t)
		return len(rs) >= n
	})
	return rs[n-1], ms[n-1]
}

// waitFor polls cond until it holds or wait passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// isTerminated reports whether the message stored at ack was terminated.
func (s *suite) isTerminated(ack *jetstream.PubAck) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.terminated[ack.Stream+":"+strconv.FormatUint(ack.Sequence, 10)]
}

// waitTerminated waits for the MSG_TERMINATED advisory of the message
// stored at ack.
func (s *suite) waitTerminated(t *testing.T, ack *jetstream.PubAck) {
	t.Helper()
	waitFor(t, "termination (Term) of the step request at "+ack.Stream+":"+strconv.FormatUint(ack.Sequence, 10), func() bool {
		return s.isTerminated(ack)
	})
}

// waitAcked waits until the pool consumer of ack's stream acknowledged
// the message (its ack floor reached it).
func (s *suite) waitAcked(t *testing.T, ack *jetstream.PubAck) {
	t.Helper()
	var floor uint64
	waitFor(t, fmt.Sprintf("ack of the step request at %s:%d", ack.Stream, ack.Sequence), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := s.res.JS.Consumer(ctx, ack.Stream, bus.PoolConsumer(Pool))
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false
		}
		floor = info.AckFloor.Stream
		return floor >= ack.Sequence
	})
}

// records reads the executions of run from the record file.
func (s *suite) records(t *testing.T, run string) []Record {
	t.Helper()
	f, err := os.Open(s.recordFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("record file %s: line %q: %v", s.recordFile, line, err)
		}
		if r.RunID == run {
			out = append(out, r)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// executions checks that run's tool was executed want times.
func (s *suite) executions(t *testing.T, run string, want int) []Record {
	t.Helper()
	recs := s.records(t, run)
	if len(recs) != want {
		t.Errorf("run %s executed %d times, want %d: %+v", run, len(recs), want, recs)
	}
	return recs
}

// stored counts the messages PLANEX_ENGINE holds about run.
func (s *suite) stored(t *testing.T, run string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.res.JS.Stream(ctx, bus.StreamEngine)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(bus.SubjectEnginePrefix+run+".>"))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// effect reads the pool's effect record of an attempt; nil when absent.
func (s *suite) effect(t *testing.T, req *planexv1.StepRequest) *planexv1.StepResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := bus.PoolEffectKey(Pool, bus.EffectKey(req.GetRunId(), req.GetStepId(), req.GetAttempt()))
	e, err := s.res.Effects.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("read %s %s: %v", bus.BucketEffects, key, err)
	}
	rec := &planexv1.StepResult{}
	if err := proto.Unmarshal(e.Value(), rec); err != nil {
		t.Fatalf("%s %s does not decode as planex.v1.StepResult: %v", bus.BucketEffects, key, err)
	}
	return rec
}
