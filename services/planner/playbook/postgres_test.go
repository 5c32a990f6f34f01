package playbook_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/planex-dev/planex/internal/demo"
)

// demoPostgres loads the demo company into a schema of its own on the
// PostgreSQL of PLANEX_TEST_POSTGRES_DSN (default: database test on
// 127.0.0.1), with the types a PostgreSQL schema would use (date,
// numeric), and returns a handle whose search_path is that schema. The
// schema is dropped when the test ends.
func demoPostgres(t *testing.T) *sql.DB {
	t.Helper()
	dsn := os.Getenv("PLANEX_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	admin, err := pgx.Connect(cctx, dsn)
	cancel()
	if err != nil {
		t.Skipf("PostgreSQL not reachable (set PLANEX_TEST_POSTGRES_DSN): %v", err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	schema := "planex_playbook_" + hex.EncodeToString(suffix[:])
	for _, stmt := range []string{
		"CREATE SCHEMA " + schema,
		"SET search_path TO " + schema,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text UNIQUE NOT NULL, region text NOT NULL, segment text NOT NULL)`,
		`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES customers(id), ordered_at date NOT NULL,
			amount numeric(12,2) NOT NULL, status text NOT NULL)`,
		`CREATE TABLE support_tickets (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES customers(id), status text NOT NULL, subject text,
			closed_at timestamptz)`,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})

	path := filepath.Join(t.TempDir(), "demo.db")
	if err := demo.GenerateDB(ctx, path); err != nil {
		t.Fatal(err)
	}
	lite, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	copyTable := func(table, query string, cols []string, conv func([]any) []any) {
		rows, err := lite.Query(query)
		if err != nil {
			t.Fatalf("read %s: %v", table, err)
		}
		defer rows.Close()
		var data [][]any
		for rows.Next() {
			row, err := scanRow(rows, len(cols))
			if err != nil {
				t.Fatal(err)
			}
			data = append(data, conv(row))
		}
		if _, err := admin.CopyFrom(ctx, pgx.Identifier{schema, table}, cols, pgx.CopyFromRows(data)); err != nil {
			t.Fatalf("copy %s: %v", table, err)
		}
	}
	id := func(v any) int64 { return int64(v.(float64)) }
	copyTable("customers", "SELECT id, name, region, segment FROM customers", []string{"id", "name", "region", "segment"},
		func(r []any) []any { return []any{id(r[0]), r[1], r[2], r[3]} })
	copyTable("orders", "SELECT id, customer_id, ordered_at, CAST(amount AS TEXT), status FROM orders", []string{"id", "customer_id", "ordered_at", "amount", "status"},
		func(r []any) []any {
			day, err := time.Parse("2006-01-02", fmt.Sprint(r[2])[:10])
			if err != nil {
				t.Fatal(err)
			}
			return []any{id(r[0]), id(r[1]), day, r[3], r[4]}
		})
	copyTable("support_tickets", "SELECT id, customer_id, status, subject FROM support_tickets", []string{"id", "customer_id", "status", "subject"},
		func(r []any) []any { return []any{id(r[0]), id(r[1]), r[2], r[3]} })

	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("pgx", dsn+sep+"search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// dollarParams numbers the ? placeholders for PostgreSQL, as the sql pool
// does; the demo SQL has no ? inside literals.
func dollarParams(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
