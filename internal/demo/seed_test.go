package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pgSchema returns a DSN whose search_path is a fresh schema of the test
// database, dropped at cleanup, and a handle on that schema.
func pgSchema(t *testing.T) (string, *sql.DB) {
	t.Helper()
	base := os.Getenv("PLANEX_TEST_POSTGRES_DSN")
	if base == "" {
		t.Skip("PLANEX_TEST_POSTGRES_DSN not set: skipping the PostgreSQL seed test (postgres://postgres@127.0.0.1:5432/test?sslmode=disable works on the CI machines)")
	}
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := fmt.Sprintf("demo_seed_%d", time.Now().UnixNano())
	if _, err := admin.Exec(`CREATE SCHEMA ` + name); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() { admin.Exec(`DROP SCHEMA ` + name + ` CASCADE`) })
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	dsn := base + sep + "search_path=" + name
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return dsn, db
}

func count(t *testing.T, db *sql.DB, query string) string {
	t.Helper()
	var v string
	if err := db.QueryRow(query).Scan(&v); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return v
}

func TestSeedPostgresMatchesSQLiteAndIsIdempotent(t *testing.T) {
	dsn, pg := pgSchema(t)
	ctx := context.Background()

	if res, err := SeedPostgres(ctx, dsn); err != nil || res != SeedCreated {
		t.Fatalf("first seed = %q, %v; want created", res, err)
	}
	if res, err := SeedPostgres(ctx, dsn); err != nil || res != SeedCurrent {
		t.Fatalf("second seed = %q, %v; want current", res, err)
	}

	path := filepath.Join(t.TempDir(), "demo.db")
	if err := GenerateDB(ctx, path); err != nil {
		t.Fatal(err)
	}
	lite, err := sql.Open("sqlite", sqliteURI(path, "ro"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	// Same rows in both: counts, sums (rounded to cents) and a sample row.
	for _, q := range []string{
		`SELECT COUNT(*) FROM customers`,
		`SELECT COUNT(*) FROM orders`,
		`SELECT COUNT(*) FROM invoices`,
		`SELECT COUNT(*) FROM support_tickets`,
		`SELECT COUNT(*) FROM support_tickets WHERE closed_at IS NULL`,
		`SELECT CAST(ROUND(CAST(SUM(amount) AS NUMERIC), 2) AS TEXT) FROM orders`,
		`SELECT name || '/' || region || '/' || segment FROM customers WHERE id = 2`,
		`SELECT value FROM meta WHERE key = 'schema_version'`,
	} {
		if got, want := count(t, pg, q), count(t, lite, q); got != want {
			t.Errorf("%s: PostgreSQL %s, SQLite %s", q, got, want)
		}
	}
}

func TestSeedPostgresRefusesForeignSchema(t *testing.T) {
	dsn, pg := pgSchema(t)
	if _, err := pg.Exec(`CREATE TABLE accounts (id INT PRIMARY KEY); INSERT INTO accounts VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	_, err := SeedPostgres(context.Background(), dsn)
	if !errors.Is(err, ErrNotDemoDB) || !strings.Contains(err.Error(), "accounts") {
		t.Fatalf("seed over a foreign table: %v; want ErrNotDemoDB naming accounts", err)
	}
	if got := count(t, pg, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()`); got != "1" {
		t.Errorf("tables after refused seed = %s, want only accounts", got)
	}
	if got := count(t, pg, `SELECT COUNT(*) FROM accounts`); got != "1" {
		t.Errorf("accounts rows = %s, want 1 (untouched)", got)
	}
}

func TestSeedPostgresUpgradesOlderDemo(t *testing.T) {
	dsn, pg := pgSchema(t)
	ctx := context.Background()
	if _, err := SeedPostgres(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	tickets := count(t, pg, `SELECT COUNT(*) FROM support_tickets`)
	if _, err := pg.Exec(`UPDATE meta SET value = '0' WHERE key = 'schema_version'; DELETE FROM support_tickets`); err != nil {
		t.Fatal(err)
	}
	if res, err := SeedPostgres(ctx, dsn); err != nil || res != SeedUpgraded {
		t.Fatalf("seed over version 0 = %q, %v; want upgraded", res, err)
	}
	if got := count(t, pg, `SELECT value FROM meta WHERE key = 'schema_version'`); got != SchemaVersion {
		t.Errorf("schema_version = %s, want %s", got, SchemaVersion)
	}
	if got := count(t, pg, `SELECT COUNT(*) FROM support_tickets`); got != tickets {
		t.Errorf("support_tickets = %s, want %s", got, tickets)
	}
}

func TestSeedPostgresConcurrent(t *testing.T) {
	dsn, pg := pgSchema(t)
	errs := make(chan error, 3)
	for range 3 {
		go func() { _, err := SeedPostgres(context.Background(), dsn); errs <- err }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent seed: %v", err)
		}
	}
	if got := count(t, pg, `SELECT COUNT(*) FROM customers`); got != fmt.Sprint(len(customerNames)) {
		t.Errorf("customers = %s, want %d", got, len(customerNames))
	}
}
