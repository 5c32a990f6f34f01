// Package quantile computes nearest-rank quantiles of measured samples,
// as the benchmarks and measurements report them (p50, p90, p99).
package quantile

import (
	"cmp"
	"slices"
)

// Of returns the p-quantile (0 ≤ p ≤ 1) of samples by nearest rank: the
// smallest sample with at least p of them at or below it (p 0: the
// minimum; 1: the maximum). It returns the zero value for no samples and
// leaves samples as they are.
func Of[T cmp.Ordered](samples []T, p float64) T {
	if len(samples) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
