package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PullOptions shape the standing pull with which Consume consumes a
// durable consumer, as nats.go's PullMaxMessages, PullHeartbeat and
// PullExpiry shape a Consume.
type PullOptions struct {
	// Batch is how many messages the client asks to have on their way at
	// most (default 500); a new pull tops them up to Batch when fewer
	// than half are left.
	Batch int
	// Heartbeat is the idle heartbeat asked of the server for a waiting
	// pull (default PullHeartbeat); two missed ones count as a lost pull,
	// reported as jetstream.ErrNoHeartbeat, and the client pulls again.
	Heartbeat time.Duration
	// Expires is how long one pull waits on the server (default 30 s);
	// an expired pull is replaced.
	Expires time.Duration
}

func (o PullOptions) withDefaults() PullOptions {
	if o.Batch <= 0 {
		o.Batch = 500
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = PullHeartbeat
	}
	if o.Expires <= 0 {
		o.Expires = 30 * time.Second
	}
	if o.Heartbeat > o.Expires/2 {
		o.Heartbeat = o.Expires / 2
	}
	return o
}

// pullRequest is the body of a request to
// $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> (durations in
// nanoseconds).
type pullRequest struct {
	Batch     int           `json:"batch"`
	Expires   time.Duration `json:"expires"`
	Heartbeat time.Duration `json:"idle_heartbeat"`
}

// puller consumes a durable pull consumer as nats.go's Consume does — a
// standing pull topped up under a threshold, idle heartbeats, a new pull
// after a reconnect or two missed heartbeats — with one difference: the
// pull is topped up in the goroutine that delivers the messages, right
// after the message that took the count under the threshold.
//
// nats.go v1.55's Consume sends the top-up from another goroutine and skips
// the count's check for the messages that arrive while it does; when every
// message still asked for arrives in that window (the server answers a
// pull in microseconds, and on a busy machine the sending goroutine is
// easily descheduled before it marks the pull sent), nothing asks again:
// the server has no pull waiting, so it sends neither messages nor
// heartbeats, and the consumer stalls until two heartbeats are missed (4 s
// with PullHeartbeat). The engine hit this in a few benches in ten
// (docs/performance.md, "The lost pull").
type puller struct {
	nc        *nats.Conn
	subject   string // the pull requests'
	opts      PullOptions
	threshold int
	handler   jetstream.MessageHandler
	onErr     func(error)

	sub    *nats.Subscription
	status chan nats.Status
	closed chan struct{} // closed when the subscription is: no handler runs any more

	mu       sync.Mutex
	pending  int  // messages asked for and neither delivered nor given up by the server
	stopping bool // Stop or Drain: no more pulls
	hb       *time.Timer
}

// pullSubject is the pull request subject of stream's consumer through
// js's API prefix or domain.
func pullSubject(js jetstream.JetStream, stream, consumer string) string {
	o := js.Options()
	prefix := jetstream.DefaultAPIPrefix
	switch {
	case o.Domain != "":
		prefix = "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		prefix = o.APIPrefix
		if !strings.HasSuffix(prefix, ".") {
			prefix += "."
		}
	}
	return prefix + "CONSUMER.MSG.NEXT." + stream + "." + consumer
}

// startPull subscribes to a new inbox and sends the first pull for
// stream's consumer. onErr receives what the server or the connection
// report (missed heartbeats, a deleted consumer, a leadership change) and
// may be nil.
func startPull(js jetstream.JetStream, stream, consumer string, handler jetstream.MessageHandler, opts PullOptions, onErr func(error)) (*puller, error) {
	opts = opts.withDefaults()
	if onErr == nil {
		onErr = func(error) {}
	}
	p := &puller{nc: js.Conn(), subject: pullSubject(js, stream, consumer), opts: opts,
		threshold: max(opts.Batch/2, 1), handler: handler, onErr: onErr, closed: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	sub, err := p.nc.Subscribe(p.nc.NewInbox(), p.deliver)
	if err != nil {
		return nil, fmt.Errorf("subscribe to the pull inbox of %s on %s: %w", consumer, stream, err)
	}
	p.sub = sub
	sub.SetClosedHandler(func(string) { close(p.closed) })
	p.status = p.nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.CLOSED)
	go p.watchConn()
	p.hb = time.AfterFunc(2*opts.Heartbeat, p.missedHeartbeats)
	if err := p.topUp(); err != nil {
		p.stopLocked(false)
		return nil, fmt.Errorf("pull %s on %s: %w", consumer, stream, err)
	}
	return p, nil
}

// deliver is the inbox's handler: messages go to the handler, status
// messages adjust the count; the pull is topped up before the next
// message is delivered.
func (p *puller) deliver(m *nats.Msg) {
	code := ""
	if len(m.Data) == 0 && len(m.Header) > 0 {
		code = m.Header.Get("Status")
	}
	if code == "" {
		// Heartbeats wait behind a handler that blocks (the engine's
		// when its hand is full): they are not missed meanwhile.
		p.mu.Lock()
		p.hb.Stop()
		p.mu.Unlock()
		p.handler(&pulled{msg: m, nc: p.nc})
		p.mu.Lock()
		p.pending--
		p.heard()
		err := p.topUp()
		p.mu.Unlock()
		if err != nil {
			p.onErr(err)
		}
		return
	}
	desc := strings.ToLower(m.Header.Get("Description"))
	var report, end error
	p.mu.Lock()
	p.heard()
	switch {
	case code == "100": // idle heartbeat
	case code == "400":
		end = fmt.Errorf("%w: %s", jetstream.ErrBadRequest, m.Header.Get("Description"))
	case code == "409" && strings.Contains(desc, "consumer deleted"):
		end = jetstream.ErrConsumerDeleted
	case code == "503":
		// Nobody took the pull: the consumer is gone (the caller looks
		// it up). Not pulled again here: that would spin until it is
		// made again.
		report = nats.ErrNoResponders
	case code == "409" && strings.Contains(desc, "leadership change"):
		// The server forgot the pulls waiting on the old leader.
		p.pending = 0
		report = jetstream.ErrConsumerLeadershipChanged
	case m.Header.Get("Nats-Pending-Messages") != "":
		// A pull that ended before it was served in full (expired, a
		// size bound): what it still owed will not come.
		if n, err := strconv.Atoi(m.Header.Get("Nats-Pending-Messages")); err == nil {
			p.pending = max(p.pending-n, 0)
		}
	default:
		// Another refusal (a server shutting down, too many pulls
		// waiting): reported; missed heartbeats pull again if it was ours.
		report = fmt.Errorf("nats: %s %s", code, m.Header.Get("Description"))
	}
	var pullErr error
	if end == nil {
		pullErr = p.topUp()
	}
	p.mu.Unlock()
	for _, err := range []error{report, end, pullErr} {
		if err != nil {
			p.onErr(err)
		}
	}
	if end != nil {
		p.Stop()
	}
}

// heard notes that the server is there. p.mu is held.
func (p *puller) heard() {
	if !p.stopping {
		p.hb.Reset(2 * p.opts.Heartbeat)
	}
}

// topUp sends a pull for what is missing to Batch when fewer than the
// threshold are on their way. p.mu is held.
func (p *puller) topUp() error {
	if p.stopping || p.pending >= p.threshold {
		return nil
	}
	body, err := json.Marshal(pullRequest{Batch: p.opts.Batch - p.pending, Expires: p.opts.Expires, Heartbeat: p.opts.Heartbeat})
	if err != nil {
		return err
	}
	if err := p.nc.PublishRequest(p.subject, p.sub.Subject, body); err != nil {
		// Not counted: the next message, heartbeat or missed heartbeat
		// tries again.
		return fmt.Errorf("send a pull: %w", err)
	}
	p.pending = p.opts.Batch
	return nil
}

// missedHeartbeats runs when nothing came for two heartbeats: the server
// has no pull of ours waiting (lost with a server, a consumer deleted, a
// refusal). Pull again from scratch.
func (p *puller) missedHeartbeats() {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return
	}
	p.pending = 0
	err := p.topUp()
	p.hb.Reset(2 * p.opts.Heartbeat)
	p.mu.Unlock()
	p.onErr(jetstream.ErrNoHeartbeat)
	if err != nil {
		p.onErr(err)
	}
}

// watchConn pulls again after a reconnect (the pulls waiting on the old
// connection are gone) and stops when the connection closes.
func (p *puller) watchConn() {
	disconnected := false
	for st := range p.status {
		switch st {
		case nats.RECONNECTING:
			disconnected = true
			p.mu.Lock()
			p.hb.Stop()
			p.mu.Unlock()
		case nats.CONNECTED:
			if !disconnected {
				continue
			}
			disconnected = false
			p.mu.Lock()
			p.pending = 0
			err := p.topUp()
			p.heard()
			p.mu.Unlock()
			if err != nil {
				p.onErr(err)
			}
		case nats.CLOSED:
			p.onErr(jetstream.ErrConnectionClosed)
			p.Stop()
			return
		}
	}
}

// Stop stops pulling and unsubscribes at once: messages received and not
// yet handled are dropped (redelivered after the ack wait). Closed is
// closed once the handler has returned.
func (p *puller) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopLocked(false)
}

// Drain stops pulling and lets the messages already received be handled;
// Closed is closed after them.
func (p *puller) Drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopLocked(true)
}

func (p *puller) stopLocked(drain bool) {
	if p.stopping {
		return
	}
	p.stopping = true
	p.hb.Stop()
	p.nc.RemoveStatusListener(p.status)
	// An error means the subscription is closed already (the
	// connection closed): its closed handler has run or will.
	if drain {
		_ = p.sub.Drain()
	} else {
		_ = p.sub.Unsubscribe()
	}
}

// Closed is closed when Stop or Drain has taken effect and the handler
// has returned.
func (p *puller) Closed() <-chan struct{} { return p.closed }

// pulled is a message delivered by a puller: a jetstream.Msg as nats.go's
// own, acknowledged on its reply subject.
type pulled struct {
	msg *nats.Msg
	nc  *nats.Conn

	mu   sync.Mutex
	done bool // acked, nacked or terminated
}

var _ jetstream.Msg = (*pulled)(nil)

// Metadata parses the reply subject,
// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending> or
// $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>].
func (m *pulled) Metadata() (*jetstream.MsgMetadata, error) {
	t := strings.Split(m.msg.Reply, ".")
	if len(t) < 2 || t[0] != "$JS" || t[1] != "ACK" || (len(t) != 9 && len(t) < 11) {
		return nil, fmt.Errorf("%w: reply subject %q", jetstream.ErrNotJSMessage, m.msg.Reply)
	}
	domain := ""
	if len(t) >= 11 {
		domain = t[2]
		if domain == "_" {
			domain = ""
		}
		t = append(t[:2:2], t[4:]...)
	}
	num := func(s string) uint64 { n, _ := strconv.ParseUint(s, 10, 64); return n }
	md := &jetstream.MsgMetadata{
		Stream:       t[2],
		Consumer:     t[3],
		NumDelivered: num(t[4]),
		Timestamp:    time.Unix(0, int64(num(t[7]))),
		NumPending:   num(t[8]),
		Domain:       domain,
	}
	md.Sequence.Stream = num(t[5])
	md.Sequence.Consumer = num(t[6])
	return md, nil
}

func (m *pulled) Data() []byte         { return m.msg.Data }
func (m *pulled) Headers() nats.Header { return m.msg.Header }
func (m *pulled) Subject() string      { return m.msg.Subject }
func (m *pulled) Reply() string        { return m.msg.Reply }

func (m *pulled) Ack() error { return m.ack(context.Background(), "+ACK", false, true) }
func (m *pulled) DoubleAck(ctx context.Context) error {
	return m.ack(ctx, "+ACK", true, true)
}
func (m *pulled) Nak() error { return m.ack(context.Background(), "-NAK", false, true) }
func (m *pulled) NakWithDelay(delay time.Duration) error {
	if delay <= 0 {
		return m.Nak()
	}
	return m.ack(context.Background(), fmt.Sprintf(`-NAK {"delay": %d}`, delay.Nanoseconds()), false, true)
}
func (m *pulled) InProgress() error { return m.ack(context.Background(), "+WPI", false, false) }
func (m *pulled) Term() error       { return m.ack(context.Background(), "+TERM", false, true) }
func (m *pulled) TermWithReason(reason string) error {
	if reason == "" {
		return m.Term()
	}
	return m.ack(context.Background(), "+TERM "+reason, false, true)
}

// ack sends body to the reply subject (waiting for the server's answer
// when sync), once for the final kinds: a second one is
// jetstream.ErrMsgAlreadyAckd, as nats.go's.
func (m *pulled) ack(ctx context.Context, body string, sync, final bool) error {
	if m.msg.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return jetstream.ErrMsgAlreadyAckd
	}
	var err error
	if sync {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
		}
		_, err = m.nc.RequestWithContext(ctx, m.msg.Reply, []byte(body))
	} else {
		err = m.nc.Publish(m.msg.Reply, []byte(body))
	}
	if err != nil {
		return err
	}
	if final {
		m.done = true
	}
	return nil
}
