package schedule

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func mustLoc(t *testing.T, name string) *time.Location {
	t.Helper()
	l, err := time.LoadLocation(name)
	if err != nil {
		t.Skipf("time zone %s not available: %v", name, err)
	}
	return l
}

func TestNextFirings(t *testing.T) {
	ny := mustLoc(t, "America/New_York")
	paris := mustLoc(t, "Europe/Paris")
	for _, tc := range []struct {
		name  string
		spec  *planexv1.ScheduleSpec
		after time.Time
		want  []string // RFC 3339, in UTC
	}{
		{"every 15 minutes", &planexv1.ScheduleSpec{Cron: "*/15 * * * *"}, time.Date(2026, 3, 1, 10, 7, 0, 0, time.UTC),
			[]string{"2026-03-01T10:15:00Z", "2026-03-01T10:30:00Z", "2026-03-01T10:45:00Z"}},
		{"seconds field", &planexv1.ScheduleSpec{Cron: "*/20 * * * * *"}, time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC),
			[]string{"2026-03-01T10:00:20Z", "2026-03-01T10:00:40Z", "2026-03-01T10:01:00Z"}},
		{"daily in Paris", &planexv1.ScheduleSpec{Cron: "0 9 * * *", TimeZone: "Europe/Paris"}, time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC),
			[]string{"2026-01-11T08:00:00Z", "2026-01-12T08:00:00Z"}},
		{"weekdays by name", &planexv1.ScheduleSpec{Cron: "30 8 * * MON-FRI"}, time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC), // a Friday
			[]string{"2026-11-30T08:30:00Z", "2026-12-01T08:30:00Z"}},
		{"day of month or weekday", &planexv1.ScheduleSpec{Cron: "0 0 1 * SUN"}, time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC),
			[]string{"2026-11-29T00:00:00Z", "2026-12-01T00:00:00Z", "2026-12-06T00:00:00Z"}},
		{"macro", &planexv1.ScheduleSpec{Cron: "@monthly"}, time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC),
			[]string{"2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"}},
		{"leap day", &planexv1.ScheduleSpec{Cron: "0 0 29 2 *"}, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
			[]string{"2028-02-29T00:00:00Z"}},
		// New York springs forward at 02:00 on 2026-03-08: 02:30 does not
		// exist and fires at the change (03:00 EDT = 07:00Z), once.
		{"spring forward gap fires at the change", &planexv1.ScheduleSpec{Cron: "30 2 * * *", TimeZone: "America/New_York"}, time.Date(2026, 3, 7, 12, 0, 0, 0, ny),
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"}},
		{"every minute across the gap", &planexv1.ScheduleSpec{Cron: "* 2 * * *", TimeZone: "America/New_York"}, time.Date(2026, 3, 8, 1, 59, 0, 0, ny),
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z"}},
		// New York falls back at 02:00 on 2026-11-01: 01:30 occurs twice
		// and fires once, at the first (EDT, 05:30Z).
		{"fall back fires once", &planexv1.ScheduleSpec{Cron: "30 1 * * *", TimeZone: "America/New_York"}, time.Date(2026, 10, 31, 12, 0, 0, 0, ny),
			[]string{"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		{"hourly through fall back", &planexv1.ScheduleSpec{Cron: "0 * * * *", TimeZone: "America/New_York"}, time.Date(2026, 11, 1, 0, 30, 0, 0, ny),
			[]string{"2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"}},
		{"Paris spring forward", &planexv1.ScheduleSpec{Cron: "15 2 * * *", TimeZone: "Europe/Paris"}, time.Date(2026, 3, 28, 12, 0, 0, 0, paris),
			[]string{"2026-03-29T01:00:00Z", "2026-03-30T00:15:00Z"}},
		{"interval", &planexv1.ScheduleSpec{Interval: durationpb.New(time.Hour), Offset: durationpb.New(15 * time.Minute)}, time.Date(2026, 3, 1, 10, 15, 0, 0, time.UTC),
			[]string{"2026-03-01T11:15:00Z", "2026-03-01T12:15:00Z"}},
		{"interval of a second", &planexv1.ScheduleSpec{Interval: durationpb.New(time.Second)}, time.Date(2026, 3, 1, 10, 0, 0, 500, time.UTC),
			[]string{"2026-03-01T10:00:01Z", "2026-03-01T10:00:02Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp, err := ParseSpec(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range sp.Upcoming(tc.after, len(tc.want)) {
				got = append(got, n.UTC().Format(time.RFC3339))
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("next firings after %s:\n got %v\nwant %v", tc.after, got, tc.want)
			}
		})
	}
}

func TestParseSpecNamesTheField(t *testing.T) {
	d := durationpb.New
	for _, tc := range []struct {
		name  string
		spec  *planexv1.ScheduleSpec
		field string
	}{
		{"nothing", &planexv1.ScheduleSpec{}, "spec: set cron or interval"},
		{"both", &planexv1.ScheduleSpec{Cron: "* * * * *", Interval: d(time.Minute)}, "not both"},
		{"four fields", &planexv1.ScheduleSpec{Cron: "* * * *"}, "spec.cron"},
		{"minute 60", &planexv1.ScheduleSpec{Cron: "60 * * * *"}, "minute field"},
		{"bad step", &planexv1.ScheduleSpec{Cron: "*/0 * * * *"}, "step"},
		{"reversed range", &planexv1.ScheduleSpec{Cron: "0 5-2 * * *"}, "hour field"},
		{"bad month name", &planexv1.ScheduleSpec{Cron: "0 0 1 FOO *"}, "month field"},
		{"never", &planexv1.ScheduleSpec{Cron: "0 0 31 2 *"}, "never fires"},
		{"bad zone", &planexv1.ScheduleSpec{Cron: "@daily", TimeZone: "Nowhere/Land"}, "spec.time_zone"},
		{"zone with interval", &planexv1.ScheduleSpec{Interval: d(time.Minute), TimeZone: "UTC"}, "spec.time_zone"},
		{"short interval", &planexv1.ScheduleSpec{Interval: d(500 * time.Millisecond)}, "spec.interval"},
		{"offset too big", &planexv1.ScheduleSpec{Interval: d(time.Minute), Offset: d(time.Minute)}, "spec.offset"},
		{"offset with cron", &planexv1.ScheduleSpec{Cron: "@hourly", Offset: d(time.Minute)}, "spec.offset"},
		{"jitter above interval", &planexv1.ScheduleSpec{Interval: d(time.Minute), Jitter: d(2 * time.Minute)}, "spec.jitter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSpec(tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("ParseSpec: %v, want an error naming %q", err, tc.field)
			}
		})
	}
}

func TestJitterIsDeterministicAndBounded(t *testing.T) {
	sp, err := ParseSpec(&planexv1.ScheduleSpec{Interval: durationpb.New(time.Minute), Jitter: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	n := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	distinct := map[time.Duration]bool{}
	for i := range 50 {
		at := n.Add(time.Duration(i) * time.Minute)
		j := sp.Jitter("a", at)
		if j < 0 || j >= 30*time.Second {
			t.Fatalf("jitter %s out of [0, 30s)", j)
		}
		if again := sp.Jitter("a", at); again != j {
			t.Fatalf("jitter of the same firing: %s then %s", j, again)
		}
		distinct[j] = true
	}
	if len(distinct) < 10 {
		t.Errorf("only %d distinct jitters over 50 firings", len(distinct))
	}
	if sp.Jitter("a", n) == sp.Jitter("b", n) && sp.Jitter("a", n.Add(time.Minute)) == sp.Jitter("b", n.Add(time.Minute)) {
		t.Error("two schedules get the same jitter")
	}
}

func TestIdempotencyKey(t *testing.T) {
	got := IdempotencyKey("nightly", time.Date(2026, 3, 1, 10, 0, 0, 0, time.FixedZone("x", 3600)))
	if want := "schedule:nightly:2026-03-01T09:00:00Z"; got != want {
		t.Fatalf("key %q, want %q", got, want)
	}
}
