package bus_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// Every stream and bucket gets a MaxBytes from the budget, the shares add
// up to at most the budget, and a full stream refuses new messages rather
// than dropping queued steps or run log entries.
func TestSetupLimitsEveryStreamAndBucket(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx := ctxT(t)
	const budget = 256 << 20
	if _, err := bus.Setup(ctx, nc, bus.Options{MaxBytes: budget}); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	var total int64
	names := js.StreamNames(ctx)
	n := 0
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		if cfg.MaxBytes <= 0 {
			t.Errorf("stream %s: MaxBytes %d, want a limit", name, cfg.MaxBytes)
		}
		// PLANEX_TIMERS cannot refuse (NATS refuses DiscardNew with
		// message schedules): HoldTimer parks timers before it fills
		// (TestFullTimersStreamParksTimers).
		if cfg.Discard != jetstream.DiscardNew && name != bus.StreamTimers {
			t.Errorf("stream %s: discard %v, want DiscardNew (refuse writes when full)", name, cfg.Discard)
		}
		total += cfg.MaxBytes
		n++
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 10 {
		t.Errorf("%d streams, want 10 (4 streams, 5 KV buckets, 1 object store)", n)
	}
	if total > budget {
		t.Errorf("MaxBytes add up to %d, over the budget %d", total, budget)
	}
}

func TestSetupRefusesStepsWhenFull(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx := ctxT(t)
	// The smallest shares are 1 MiB: fill the steps queue past it.
	if _, err := bus.Setup(ctx, nc, bus.Options{MaxBytes: 10 << 20}); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	payload := make([]byte, 64<<10)
	var err error
	for i := 0; i < 64 && err == nil; i++ {
		_, err = js.Publish(ctx, bus.SubjectStepsPrefix+"sql.x", payload)
	}
	if !errors.Is(err, jetstream.ErrMaxBytesExceeded) && (err == nil || !containsAny(err.Error(), "maximum bytes exceeded", "resource limits exceeded")) {
		t.Fatalf("publishing past MaxBytes: %v, want a refusal", err)
	}
}

func containsAny(s string, subs ...string) bool {
	return slices.ContainsFunc(subs, func(sub string) bool { return strings.Contains(s, sub) })
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"8GiB", 8 << 30, true},
		{"512MiB", 512 << 20, true},
		{"1GB", 1e9, true},
		{"1048576", 1 << 20, true},
		{" 2 KiB ", 2048, true},
		{"", 0, false},
		{"-1GiB", 0, false},
		{"lots", 0, false},
		{"99999999999TiB", 0, false},
	} {
		got, err := bus.ParseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
