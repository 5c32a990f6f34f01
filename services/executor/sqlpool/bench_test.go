package sqlpool

import (
	"testing"

	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// BenchmarkQuery measures one sql.query step end to end on each backend:
// statement checks, transaction, and on PostgreSQL the session reset
// (DISCARD ALL) that follows every step.
//
//	go test -run '^$' -bench BenchmarkQuery ./services/executor/sqlpool/
func BenchmarkQuery(b *testing.B) {
	for _, bk := range []struct {
		name string
		fx   func(testing.TB, Config) *fixture
	}{{"sqlite", sqliteFixture}, {"postgres", postgresFixture}} {
		b.Run(bk.name, func(b *testing.B) {
			fx := bk.fx(b, Config{})
			args := map[string]any{"sql": "SELECT id, name, score FROM t WHERE id > $1 ORDER BY id", "params": []any{1}}
			if fx.name == "sqlite" {
				args["sql"] = "SELECT id, name, score FROM t WHERE id > ? ORDER BY id"
			}
			for b.Loop() {
				if _, terr := runnertest.Call(b, fx.pool.Tools(), "sql.query", runner.Call{}, args); terr != nil {
					b.Fatal(terr)
				}
			}
		})
	}
}
