package quantile

import (
	"slices"
	"testing"
	"time"
)

func TestOf(t *testing.T) {
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100 … 1, unsorted
	}
	for _, tc := range []struct {
		name    string
		samples []int
		p       float64
		want    int
	}{
		{"none", nil, 0.5, 0},
		{"one", []int{7}, 0.99, 7},
		{"min", hundred, 0, 1},
		{"p50 of 100", hundred, 0.5, 50},
		{"p90 of 100", hundred, 0.9, 90},
		{"p99 of 100", hundred, 0.99, 99},
		{"max", hundred, 1, 100},
		{"p50 of 3", []int{3, 1, 2}, 0.5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.samples)
			if got := Of(tc.samples, tc.p); got != tc.want {
				t.Fatalf("Of(%v, %g) = %d, want %d", tc.samples, tc.p, got, tc.want)
			}
			if !slices.Equal(tc.samples, before) {
				t.Fatal("the samples were reordered")
			}
		})
	}
	if got := Of([]time.Duration{3 * time.Millisecond, time.Millisecond}, 0.5); got != time.Millisecond {
		t.Fatalf("durations: %s, want 1ms", got)
	}
}
