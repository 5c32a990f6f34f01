//go:build !unix

package bench

import "time"

// rssMiB is not measured on this platform.
func rssMiB() float64 { return 0 }

// cpuTime is not measured on this platform.
func cpuTime() time.Duration { return 0 }
