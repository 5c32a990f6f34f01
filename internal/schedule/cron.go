package schedule

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Cron is a parsed cron expression evaluated in a time zone.
//
// Daylight-saving changes are handled as cronie does: a wall-clock time
// the change skips (02:30 on the spring-forward night) fires at the
// instant of the change, once however many times of the gap the
// expression names; a wall-clock time that occurs twice (01:30 on the
// fall-back night) fires once, at its first occurrence. robfig/cron
// instead skips the first and fires the second twice.
type Cron struct {
	second, minute, hour, dom, month, dow uint64
	// domStar and dowStar: the field was "*" (or "?"), which matters for
	// the classic rule that a restricted day-of-month and a restricted
	// day-of-week match either.
	domStar, dowStar bool
	loc              *time.Location
}

var monthNames = map[string]int{"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
	"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}

var dayNames = map[string]int{"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}

var cronMacros = map[string]string{
	"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
	"@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}

// ParseCron parses a cron expression of five fields (minute hour
// day-of-month month day-of-week) or six (seconds first), or a macro
// (@daily ...), evaluated in loc.
func ParseCron(expr string, loc *time.Location) (*Cron, error) {
	e := strings.TrimSpace(expr)
	if m, ok := cronMacros[strings.ToLower(e)]; ok {
		e = m
	}
	fields := strings.Fields(e)
	switch len(fields) {
	case 5:
		fields = append([]string{"0"}, fields...)
	case 6:
	default:
		return nil, fmt.Errorf("%q: want 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or a macro like @daily", expr)
	}
	c := &Cron{loc: loc}
	specs := []struct {
		name     string
		min, max int
		names    map[string]int
		dst      *uint64
	}{
		{"second", 0, 59, nil, &c.second},
		{"minute", 0, 59, nil, &c.minute},
		{"hour", 0, 23, nil, &c.hour},
		{"day-of-month", 1, 31, nil, &c.dom},
		{"month", 1, 12, monthNames, &c.month},
		{"day-of-week", 0, 7, dayNames, &c.dow},
	}
	for i, s := range specs {
		bits, err := parseField(fields[i], s.min, s.max, s.names)
		if err != nil {
			return nil, fmt.Errorf("%q: %s field %q: %w", expr, s.name, fields[i], err)
		}
		*s.dst = bits
	}
	c.domStar = fields[3] == "*" || fields[3] == "?"
	c.dowStar = fields[5] == "*" || fields[5] == "?"
	if c.dow&(1<<7) != 0 { // 7 is Sunday too
		c.dow = c.dow&^(1<<7) | 1
	}
	return c, nil
}

// parseField parses one comma-separated field into a bit set.
func parseField(f string, lo, hi int, names map[string]int) (uint64, error) {
	var set uint64
	for _, part := range strings.Split(f, ",") {
		rng, stepStr, hasStep := strings.Cut(part, "/")
		step := 1
		if hasStep {
			n, err := strconv.Atoi(stepStr)
			if err != nil || n < 1 {
				return 0, fmt.Errorf("step %q: want a positive number", stepStr)
			}
			step = n
		}
		var from, to int
		switch {
		case rng == "*" || rng == "?":
			from, to = lo, hi
		default:
			a, b, isRange := strings.Cut(rng, "-")
			var err error
			if from, err = fieldValue(a, lo, hi, names); err != nil {
				return 0, err
			}
			to = from
			if isRange {
				if to, err = fieldValue(b, lo, hi, names); err != nil {
					return 0, err
				}
				if to < from {
					return 0, fmt.Errorf("range %q: the end is before the start", rng)
				}
			} else if hasStep {
				to = hi // "5/15" means 5-max/15
			}
		}
		for v := from; v <= to; v += step {
			set |= 1 << uint(v)
		}
	}
	return set, nil
}

func fieldValue(s string, lo, hi int, names map[string]int) (int, error) {
	if v, ok := names[strings.ToLower(s)]; ok {
		return v, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("value %q: want a number from %d to %d", s, lo, hi)
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("value %d: want %d to %d", v, lo, hi)
	}
	return v, nil
}

// cronHorizon bounds the search for the next firing (a 29 February that
// is a Monday can be 28 years away).
const cronHorizon = 30 * 366

// Next is the first firing strictly after t, or the zero time when none
// comes within 30 years.
func (c *Cron) Next(t time.Time) time.Time {
	lt := t.In(c.loc)
	y, m, d := lt.Date()
	first := true
	for day := 0; day < cronHorizon; day++ {
		date := time.Date(y, m, d+day, 12, 0, 0, 0, c.loc)
		if !c.dayMatches(date) {
			first = false
			continue
		}
		h0, mi0, s0 := 0, 0, 0
		if first {
			h0, mi0, s0 = lt.Hour(), lt.Minute(), lt.Second()
		}
		for h := h0; h < 24; h++ {
			if c.hour&(1<<uint(h)) == 0 {
				continue
			}
			mStart := 0
			if first && h == h0 {
				mStart = mi0
			}
			for mi := mStart; mi < 60; mi++ {
				if c.minute&(1<<uint(mi)) == 0 {
					continue
				}
				sStart := 0
				if first && h == h0 && mi == mi0 {
					sStart = s0
				}
				for s := sStart; s < 60; s++ {
					if c.second&(1<<uint(s)) == 0 {
						continue
					}
					if at := c.instant(date, h, mi, s); at.After(t) {
						return at
					}
				}
			}
		}
		first = false
	}
	return time.Time{}
}

func (c *Cron) dayMatches(date time.Time) bool {
	if c.month&(1<<uint(date.Month())) == 0 {
		return false
	}
	dom := c.dom&(1<<uint(date.Day())) != 0
	dow := c.dow&(1<<uint(date.Weekday())) != 0
	if !c.domStar && !c.dowStar {
		return dom || dow
	}
	return dom && dow
}

// instant is the instant of a wall-clock time of date's day: the instant
// of the daylight-saving change for a time it skips, the first
// occurrence for a time that occurs twice.
func (c *Cron) instant(date time.Time, h, mi, s int) time.Time {
	y, m, d := date.Date()
	at := time.Date(y, m, d, h, mi, s, 0, c.loc)
	want := time.Date(y, m, d, h, mi, s, 0, time.UTC)
	got := wall(at)
	if !got.Equal(want) {
		// In a gap: the change is the start of at's zone period when at
		// came out after the wanted wall time, else its end.
		start, end := at.ZoneBounds()
		if got.After(want) {
			return start
		}
		return end
	}
	// Occurs twice? The earlier occurrence is in the period before at's.
	start, _ := at.ZoneBounds()
	if start.IsZero() {
		return at
	}
	_, offBefore := start.Add(-time.Second).Zone()
	_, offAt := at.Zone()
	if offBefore > offAt {
		if earlier := at.Add(-time.Duration(offBefore-offAt) * time.Second); earlier.Before(start) && wall(earlier).Equal(want) {
			return earlier
		}
	}
	return at
}

// wall is t's wall-clock reading as a UTC time (for comparisons).
func wall(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, t.Hour(), t.Minute(), t.Second(), 0, time.UTC)
}
