package redact_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/planex-dev/planex/internal/redact"
)

// rowsOutput is an SQL tool's output of n rows with no secret in it.
func rowsOutput(n int) any {
	rows := make([]any, n)
	for i := range rows {
		rows[i] = map[string]any{
			"id": float64(i), "customer": fmt.Sprintf("Customer %d", i), "email": fmt.Sprintf("c%d@example.com", i),
			"note": "Ordered the premium plan; renewal due next quarter", "total": 1234.5,
		}
	}
	return map[string]any{"columns": []any{"id", "customer", "email", "note", "total"}, "rows": rows}
}

// BenchmarkLeaves measures masking a clean 50-row output, the cost each
// step's output pays before it is stored.
func BenchmarkLeaves(b *testing.B) {
	secrets := redact.New(redact.SecretPatterns()...)
	out := rowsOutput(50)
	b.ReportAllocs()
	for b.Loop() {
		if _, changed := secrets.Leaves(out); changed {
			b.Fatal("changed")
		}
	}
}

// BenchmarkStringProse measures one 4 KiB paragraph without secrets.
func BenchmarkStringProse(b *testing.B) {
	secrets := redact.New(redact.SecretPatterns()...)
	s := strings.Repeat("The quarterly report lists 42 open tickets and 7 escalations. ", 64)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		_ = secrets.String(s)
	}
}
