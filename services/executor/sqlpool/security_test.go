package sqlpool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// secDB is a database of its own, with a table app.t, a read-only role
// made by GrantReadOnly and, when the server has it, the dblink extension.
type secDB struct {
	name   string
	role   string
	dblink bool
	// admin is a superuser connection to the database.
	admin *pgx.Conn
	// superDSN and roleDSN connect to it as the superuser and as role,
	// with search_path app.
	superDSN, roleDSN string
}

func adminDSN(t testing.TB) string {
	dsn := os.Getenv("PLANEX_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	return dsn
}

// withDB returns dsn pointing at database db as user (kept when empty).
func withDB(t testing.TB, dsn, db, user string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	if user != "" {
		u.User = url.User(user)
	}
	q := u.Query()
	q.Set("search_path", "app")
	u.RawQuery = q.Encode()
	return u.String()
}

func newSecDB(t *testing.T) *secDB {
	t.Helper()
	dsn := adminDSN(t)
	ctx := runnertest.Context(t)
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	root, err := pgx.Connect(cctx, dsn)
	cancel()
	if err != nil {
		t.Skipf("PostgreSQL not reachable at %s (set PLANEX_TEST_POSTGRES_DSN): %v", redactDSN(dsn), err)
	}
	t.Cleanup(func() { _ = root.Close(context.Background()) })
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	s := &secDB{name: "planex_sec_" + hex.EncodeToString(suffix[:]), role: "planex_ro_" + hex.EncodeToString(suffix[:])}
	mustExec(t, root, "CREATE DATABASE "+s.name)
	mustExec(t, root, "CREATE ROLE "+s.role+" LOGIN")
	t.Cleanup(func() {
		bg := context.Background()
		for _, q := range []string{"DROP DATABASE IF EXISTS " + s.name + " WITH (FORCE)", "DROP ROLE IF EXISTS " + s.role} {
			if _, err := root.Exec(bg, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	s.superDSN = withDB(t, dsn, s.name, "")
	s.roleDSN = withDB(t, dsn, s.name, s.role)
	if s.admin, err = pgx.Connect(ctx, s.superDSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.admin.Close(context.Background()) })
	mustExec(t, s.admin, "CREATE SCHEMA app")
	mustExec(t, s.admin, "CREATE TABLE app.t (id integer PRIMARY KEY, name text NOT NULL)")
	mustExec(t, s.admin, "INSERT INTO app.t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
	if _, err := s.admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS dblink"); err == nil {
		s.dblink = true
	} else {
		t.Logf("dblink not available on this server, its cases are skipped (apt-get install postgresql-contrib): %v", err)
	}
	if err := GrantReadOnly(ctx, s.superDSN, GrantOptions{Role: s.role, Schemas: []string{"app"}}); err != nil {
		t.Fatal(err)
	}
	return s
}

func mustExec(t testing.TB, c *pgx.Conn, q string) {
	t.Helper()
	if _, err := c.Exec(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// state is everything the reproductions could change: the rows, the
// advisory locks held in the database, and the sessions alive.
func (s *secDB) state(t testing.TB) string {
	t.Helper()
	var rows, locks int
	ctx := context.Background()
	if err := s.admin.QueryRow(ctx, "SELECT count(*) FROM app.t").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := s.admin.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&locks); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("rows=%d advisory_locks=%d", rows, locks)
}

func TestPostgresRoleCheck(t *testing.T) {
	s := newSecDB(t)
	ctx := runnertest.Context(t)
	_, err := Open(ctx, Config{DSN: s.superDSN})
	if !errors.Is(err, ErrPrivilegedRole) || !strings.Contains(err.Error(), "superuser") || !strings.Contains(err.Error(), "--sql-allow-privileged-role") {
		t.Fatalf("Open as superuser: %v, want ErrPrivilegedRole naming superuser and the override flag", err)
	}

	writer := "planex_rw_" + strings.TrimPrefix(s.role, "planex_ro_")
	mustExec(t, s.admin, "CREATE ROLE "+writer+" LOGIN")
	t.Cleanup(func() {
		_, _ = s.admin.Exec(context.Background(), "DROP OWNED BY "+writer)
		_, _ = s.admin.Exec(context.Background(), "DROP ROLE "+writer)
	})
	mustExec(t, s.admin, "GRANT USAGE ON SCHEMA app TO "+writer)
	mustExec(t, s.admin, "GRANT SELECT, INSERT ON app.t TO "+writer)
	writerDSN := strings.Replace(s.roleDSN, s.role, writer, 1)
	if _, err = Open(ctx, Config{DSN: writerDSN}); !errors.Is(err, ErrPrivilegedRole) || !strings.Contains(err.Error(), "INSERT on app.t") {
		t.Fatalf("Open as a role with INSERT: %v, want ErrPrivilegedRole naming INSERT on app.t", err)
	}
	mustExec(t, s.admin, "REVOKE INSERT ON app.t FROM "+writer)
	mustExec(t, s.admin, "GRANT CREATE ON SCHEMA app TO "+writer)
	if _, err = Open(ctx, Config{DSN: writerDSN}); !errors.Is(err, ErrPrivilegedRole) || !strings.Contains(err.Error(), "CREATE on schema app") {
		t.Fatalf("Open as a role with CREATE on the schema: %v, want ErrPrivilegedRole naming it", err)
	}

	p, err := Open(ctx, Config{DSN: s.roleDSN})
	if err != nil {
		t.Fatalf("Open as the granted read-only role: %v", err)
	}
	defer p.Close()
	out, terr := call(t, p, "sql.query", map[string]any{"sql": "SELECT count(*) FROM t"})
	if terr != nil || out.(*QueryOutput).Rows[0][0] != int64(3) {
		t.Fatalf("read as the read-only role: %v %v", out, terr)
	}
	// sql.exec through the read-only role is refused by the database.
	if _, terr := call(t, p, "sql.exec", map[string]any{"sql": "INSERT INTO t VALUES (9, 'x')"}); terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED {
		t.Fatalf("sql.exec as the read-only role: %v, want PERMISSION_DENIED", terr)
	}

	// With a separate write role, sql.exec writes and sql.query still
	// reads through the read-only role.
	wp, err := Open(ctx, Config{DSN: s.roleDSN, WriteDSN: s.superDSN})
	if err != nil {
		t.Fatalf("Open with a write DSN: %v", err)
	}
	defer wp.Close()
	if out, terr := call(t, wp, "sql.exec", map[string]any{"sql": "INSERT INTO t VALUES (9, 'x')"}); terr != nil || out.(map[string]any)["rows_affected"] != int64(1) {
		t.Fatalf("sql.exec through --sql-write-dsn: %v %v", out, terr)
	}
	if _, err := wp.db.query(ctx, "SELECT set_config('work_mem', '1MB', false)", nil, 1); err == nil {
		t.Fatal("the read path of a pool with a write DSN ran set_config: it does not use the read-only role")
	}

	// The override starts a privileged pool (with a warning).
	sp, err := Open(ctx, Config{DSN: s.superDSN, AllowPrivilegedRole: true})
	if err != nil {
		t.Fatalf("Open as superuser with the override: %v", err)
	}
	_ = sp.Close()
}

// TestPostgresReproductions replays issue 11's attacks on PostgreSQL as the
// read-only role and as a superuser started with the override: each is
// refused, and afterwards no row changed, no advisory lock is held, no
// session was killed and no file was read.
func TestPostgresReproductions(t *testing.T) {
	s := newSecDB(t)
	ctx := runnertest.Context(t)
	connStr := strings.Replace(withDB(t, adminDSN(t), s.name, ""), "search_path=app", "", 1)
	cases := []struct {
		name   string
		sql    string
		dblink bool
	}{
		{name: "advisory lock through query_to_xml", sql: "SELECT query_to_xml('select pg_advisory_lock(4243)', true, false, '')"},
		{name: "advisory lock", sql: "SELECT pg_advisory_lock(4244)"},
		{name: "terminate backend through query_to_xml", sql: "SELECT query_to_xml('select pg_terminate_backend(%d)', true, false, '')"},
		{name: "terminate backend", sql: "SELECT pg_terminate_backend(%d)"},
		{name: "read file through U& identifier", sql: `SELECT U&"pg\005fread\005ffile"('/etc/hostname')`},
		{name: "read file through UESCAPE", sql: `SELECT U&"pg!005fread!005ffile" UESCAPE '!' ('/etc/hostname')`},
		{name: "read file through E string", sql: `SELECT query_to_xml(E'select pg\x5fread\x5ffile(\'/etc/hostname\')', true, false, '')`},
		{name: "dblink_exec through query_to_xml", dblink: true,
			sql: "SELECT query_to_xml('select dblink_exec(''" + connStr + "'', ''INSERT INTO app.t VALUES (99, ''''evil'''')'')', true, false, '')"},
		{name: "dblink_exec", dblink: true, sql: "SELECT dblink_exec('" + connStr + "', 'INSERT INTO app.t VALUES (98, ''evil'')')"},
	}
	for _, who := range []struct {
		name string
		cfg  Config
		dsn  string
	}{
		{name: "read-only role", cfg: Config{DSN: s.roleDSN}, dsn: s.roleDSN},
		{name: "superuser with override", cfg: Config{DSN: s.superDSN, AllowPrivilegedRole: true}, dsn: s.superDSN},
	} {
		t.Run(who.name, func(t *testing.T) {
			p, err := Open(ctx, who.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			// The victim is a session of the same role: the one another
			// session of that role may signal.
			victim, err := pgx.Connect(ctx, who.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer victim.Close(context.Background())
			pid := victim.PgConn().PID()
			before := s.state(t)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					if c.dblink && !s.dblink {
						t.Skip("dblink extension not available on this server (apt-get install postgresql-contrib)")
					}
					q := c.sql
					if strings.Contains(q, "%d") {
						q = fmt.Sprintf(q, pid)
					}
					out, terr := call(t, p, "sql.query", map[string]any{"sql": q})
					if terr == nil {
						t.Fatalf("sql.query ran %q: %v", q, out)
					}
					if terr.Code != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED || terr.Field != "args.sql" {
						t.Fatalf("sql.query %q: %v (code %v), want PERMISSION_DENIED on args.sql", q, terr, terr.Code)
					}
					if strings.Contains(terr.Message, "localhost") || strings.Contains(fmt.Sprint(out), "planex") {
						t.Fatalf("the refusal leaks the file: %v", terr)
					}
					if who.cfg.AllowPrivilegedRole {
						return
					}
					// Below the statement checks, the role's privileges
					// refuse the same statement.
					if _, err := p.db.query(ctx, q, nil, 10); err == nil {
						t.Fatalf("the read-only role ran %q past the statement checks", q)
					}
				})
			}
			if err := victim.Ping(ctx); err != nil {
				t.Fatalf("the victim session was killed: %v", err)
			}
			if after := s.state(t); after != before {
				t.Fatalf("state changed: before %s, after %s", before, after)
			}
		})
	}
}

// TestPostgresSessionResetAfterStep runs a statement that takes a
// session-level advisory lock straight on the read path (bypassing the
// statement checks, as a superuser could through a function the checks do
// not know): no lock is held once the step ends.
func TestPostgresSessionResetAfterStep(t *testing.T) {
	s := newSecDB(t)
	ctx := runnertest.Context(t)
	p, err := Open(ctx, Config{DSN: s.superDSN, AllowPrivilegedRole: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	before := s.state(t)
	for _, q := range []string{
		"SELECT query_to_xml('select pg_advisory_lock(4243)', true, false, '')",
		"SELECT pg_advisory_lock(4245)",
		"SELECT pg_try_advisory_lock(4246)",
	} {
		if _, err := p.db.query(ctx, q, nil, 10); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if after := s.state(t); after != before {
			t.Fatalf("after %q: %s, want %s (the lock outlived the step)", q, after, before)
		}
	}
	// Queries still work on the reset connections (pgx forgot its
	// prepared statements along with the server).
	for range 3 {
		out, err := p.db.query(ctx, "SELECT count(*) FROM t WHERE id > $1", []any{int64(0)}, 10)
		if err != nil || out.Rows[0][0] != int64(3) {
			t.Fatalf("query after reset: %v %v", out, err)
		}
	}
}

func TestGrantReadOnlySQL(t *testing.T) {
	script, err := GrantReadOnlySQL(GrantOptions{Role: "planex_ro", Schemas: []string{"sales", "public"}, KeepFor: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`GRANT SELECT ON ALL TABLES IN SCHEMA "sales" TO "planex_ro";`,
		`GRANT USAGE ON SCHEMA "public" TO "planex_ro";`,
		`ALTER ROLE "planex_ro" NOSUPERUSER`,
		"default_transaction_read_only = on",
		"REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC, %I",
		"GRANT EXECUTE ON FUNCTION %s TO %I', f, 'app'",
		"query_to_xml", "dblink.*", "pg_advisory.*", "pg_terminate_backend", "set_config", "pg_notify", "lo_.*", "pg_read_file",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("script lacks %q:\n%s", want, script)
		}
	}
	for _, bad := range []GrantOptions{{Role: "Robert'); DROP TABLE x; --"}, {Role: "ok", Schemas: []string{"a b"}}, {Role: ""}, {Role: "ok", KeepFor: []string{"x'"}}} {
		if _, err := GrantReadOnlySQL(bad); err == nil {
			t.Errorf("GrantReadOnlySQL(%+v) accepted it", bad)
		}
	}
}
