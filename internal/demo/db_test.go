package demo

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// sharedDir holds the database that read-only tests share; generating one
// per test is slow under the race detector.
var sharedDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "planex-demo-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var generateShared = sync.OnceValues(func() (string, error) {
	path := filepath.Join(sharedDir, "demo.db")
	return path, GenerateDB(context.Background(), path)
})

// sharedDB returns the path of a demo database generated once per test
// binary. Tests must not modify it.
func sharedDB(t testing.TB) string {
	t.Helper()
	path, err := generateShared()
	if err != nil {
		t.Fatalf("GenerateDB: %v", err)
	}
	return path
}

// copyDB copies the shared database into a fresh temporary directory, for
// tests that modify it.
func copyDB(t testing.TB) string {
	t.Helper()
	content, err := os.ReadFile(sharedDB(t))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "demo.db")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// openRO opens a database read-only for the duration of the test.
func openRO(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqliteURI(path, "ro"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// queryRows runs query and renders every row as one line, so that results
// can be compared as text.
func queryRows(t testing.TB, db *sql.DB, query string, args ...any) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(vals...))
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return out
}

// queryInt runs a query that returns one integer.
func queryInt(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// answerQueries are questions demo goals ask; their answers must not change
// between generations.
var answerQueries = map[string]string{
	"sum of 2025 orders": `SELECT round(sum(amount), 2) FROM orders WHERE ordered_at BETWEEN '2025-01-01' AND '2025-12-31'`,
	"2025 average order by region": `SELECT c.region, round(avg(o.amount), 2) FROM orders o JOIN customers c ON c.id = o.customer_id
		WHERE o.ordered_at BETWEEN '2025-01-01' AND '2025-12-31' GROUP BY c.region ORDER BY c.region`,
	"open tickets by customer": `SELECT c.name, count(*) FROM support_tickets t JOIN customers c ON c.id = t.customer_id
		WHERE t.status = 'open' GROUP BY c.name ORDER BY c.name`,
	"failed invoices": `SELECT id, customer_id, amount FROM invoices WHERE status = 'failed' ORDER BY id`,
}

// The second generation goes to a directory that does not exist yet and
// whose name a SQLite URI must escape.
func TestGenerateDBDeterministic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data dir?#%", "sql", "demo.db")
	if err := GenerateDB(t.Context(), path); err != nil {
		t.Fatalf("GenerateDB: %v", err)
	}
	assertOnlyFile(t, path)
	a, b := openRO(t, sharedDB(t)), openRO(t, path)
	for _, table := range []string{"meta", "customers", "orders", "invoices", "support_tickets"} {
		query := "SELECT * FROM " + table + " ORDER BY 1"
		rowsA, rowsB := queryRows(t, a, query), queryRows(t, b, query)
		if len(rowsA) != len(rowsB) {
			t.Errorf("%s: %d rows, then %d rows", table, len(rowsA), len(rowsB))
			continue
		}
		for i := range rowsA {
			if rowsA[i] != rowsB[i] {
				t.Errorf("%s: row %d differs:\n%s\n%s", table, i+1, rowsA[i], rowsB[i])
				break
			}
		}
	}
	for name, query := range answerQueries {
		if gotA, gotB := queryRows(t, a, query), queryRows(t, b, query); !slices.Equal(gotA, gotB) {
			t.Errorf("%s: %v, then %v", name, gotA, gotB)
		}
	}
}

func TestGenerateDBSecondCallIsNoop(t *testing.T) {
	path := copyDB(t)
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	if err := GenerateDB(t.Context(), path); err != nil {
		t.Fatalf("second GenerateDB: %v", err)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Error("second GenerateDB replaced the database")
	}
	if again, err := os.ReadFile(path); err != nil || !bytes.Equal(again, content) {
		t.Errorf("second GenerateDB changed the database (read error %v)", err)
	}
	assertOnlyFile(t, path)
}

func TestGenerateDBRebuildsOtherVersion(t *testing.T) {
	path := copyDB(t)
	db, err := sql.Open("sqlite", sqliteURI(path, "rw"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(t.Context(), `UPDATE meta SET value = '0' WHERE key = 'schema_version'`)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	if err := GenerateDB(t.Context(), path); err != nil {
		t.Fatalf("GenerateDB over version 0: %v", err)
	}
	got := queryRows(t, openRO(t, path), `SELECT value FROM meta WHERE key = 'schema_version'`)
	if !slices.Equal(got, []string{SchemaVersion}) {
		t.Errorf("schema_version = %v, want %s", got, SchemaVersion)
	}
	assertOnlyFile(t, path)
}

// GenerateDB refuses to touch an existing file that is not a demo database:
// it might be somebody's data, so the user decides whether to delete it.
func TestGenerateDBForeignFile(t *testing.T) {
	realDB, err := os.ReadFile(sharedDB(t))
	if err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(t.TempDir(), "other.db")
	db, err := sql.Open("sqlite", foreign)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(t.Context(), `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)`)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	foreignDB, err := os.ReadFile(foreign)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		content []byte
	}{
		{"empty", nil},
		{"garbage", []byte("this is not a database\n")},
		{"truncated header", realDB[:10]},
		{"truncated demo db", realDB[:4096]},
		{"other sqlite db", foreignDB},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "demo.db")
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			err := GenerateDB(t.Context(), path)
			if !errors.Is(err, ErrNotDemoDB) {
				t.Fatalf("GenerateDB = %v, want an error wrapping ErrNotDemoDB", err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "remove the file") {
				t.Errorf("error %q should name the file and say how to recover", err)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, tc.content) {
				t.Error("GenerateDB modified the foreign file")
			}
			assertOnlyFile(t, path)
		})
	}
}

func TestGenerateDBPathIsDirectory(t *testing.T) {
	path := t.TempDir()
	if err := GenerateDB(t.Context(), path); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("GenerateDB(directory) = %v, want an error saying it is a directory", err)
	}
}

func TestGenerateDBCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	dir := t.TempDir()
	path := filepath.Join(dir, "demo.db")
	if err := GenerateDB(ctx, path); !errors.Is(err, context.Canceled) {
		t.Errorf("GenerateDB(cancelled) = %v, want context.Canceled", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("cancelled GenerateDB left %v behind", entries)
	}
}

// assertOnlyFile fails unless path is the only entry of its directory: no
// temporary database or journal was left behind.
func assertOnlyFile(t *testing.T, path string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{filepath.Base(path)}) {
		t.Errorf("directory holds %v, want only %s", names, filepath.Base(path))
	}
}

func TestSchema(t *testing.T) {
	db := openRO(t, sharedDB(t))
	want := map[string][]string{
		"meta":            {"key", "value"},
		"customers":       {"id", "name", "region", "segment", "created_at"},
		"orders":          {"id", "customer_id", "ordered_at", "amount", "status"},
		"invoices":        {"id", "order_id", "customer_id", "issued_at", "due_at", "amount", "status", "payment_attempts"},
		"support_tickets": {"id", "customer_id", "opened_at", "closed_at", "status", "priority", "subject"},
	}
	for table, cols := range want {
		got := queryRows(t, db, `SELECT name FROM pragma_table_info(?) ORDER BY cid`, table)
		if !slices.Equal(got, cols) {
			t.Errorf("%s columns = %v, want %v", table, got, cols)
		}
	}
	// The replanning demo depends on this: region lives only on customers.
	if n := queryInt(t, db, `SELECT count(*) FROM pragma_table_info('orders') WHERE name = 'region'`); n != 0 {
		t.Error("orders has a region column")
	}
	if _, err := db.QueryContext(t.Context(), `SELECT region FROM orders`); err == nil || !strings.Contains(err.Error(), "no such column") {
		t.Errorf("SELECT region FROM orders: err = %v, want no such column", err)
	}
	indexes := queryRows(t, db, `SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name`)
	for _, idx := range []string{"orders_customer_id", "orders_ordered_at", "invoices_order_id", "invoices_customer_id", "support_tickets_customer_id", "support_tickets_opened_at"} {
		if !slices.Contains(indexes, idx) {
			t.Errorf("missing index %s (have %v)", idx, indexes)
		}
	}
	if problems := queryRows(t, db, `SELECT * FROM pragma_foreign_key_check`); len(problems) > 0 {
		t.Errorf("foreign key violations: %v", problems)
	}
}

func TestRowCounts(t *testing.T) {
	db := openRO(t, sharedDB(t))
	for _, tc := range []struct {
		name     string
		query    string
		min, max int
	}{
		{"customers", `SELECT count(*) FROM customers`, 50, 80},
		{"orders", `SELECT count(*) FROM orders`, 2000, 5000},
		{"invoices", `SELECT count(*) FROM invoices`, 2000, 5000},
		{"support tickets", `SELECT count(*) FROM support_tickets`, 200, 900},
		{"regions", `SELECT count(DISTINCT region) FROM customers`, 4, 4},
		{"orders outside 2024-2025", `SELECT count(*) FROM orders WHERE ordered_at NOT BETWEEN '2024-01-01' AND '2025-12-31'`, 0, 0},
		{"orders not ISO dates", `SELECT count(*) FROM orders WHERE date(ordered_at) IS NOT ordered_at`, 0, 0},
		{"orders in 2024", `SELECT count(*) FROM orders WHERE ordered_at LIKE '2024-%'`, 1000, 3000},
		{"orders in 2025", `SELECT count(*) FROM orders WHERE ordered_at LIKE '2025-%'`, 1000, 3000},
		{"pending orders", `SELECT count(*) FROM orders WHERE status = 'pending'`, 1, 200},
		{"refunded orders", `SELECT count(*) FROM orders WHERE status = 'refunded'`, 1, 400},
		{"orders without invoice", `SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM invoices i WHERE i.order_id = o.id)`, 0, 0},
		{"failed invoices", `SELECT count(*) FROM invoices WHERE status = 'failed'`, 5, 200},
		{"overdue invoices", `SELECT count(*) FROM invoices WHERE status = 'overdue'`, 5, 200},
		{"closed tickets without closed_at", `SELECT count(*) FROM support_tickets WHERE (status = 'closed') != (closed_at IS NOT NULL)`, 0, 0},
		{"tickets closed before opened", `SELECT count(*) FROM support_tickets WHERE closed_at < opened_at`, 0, 0},
		{"tickets after AsOf", `SELECT count(*) FROM support_tickets WHERE opened_at >= date('` + AsOf + `', '+1 day') OR closed_at >= date('` + AsOf + `', '+1 day')`, 0, 0},
	} {
		if n := queryInt(t, db, tc.query); n < tc.min || n > tc.max {
			t.Errorf("%s = %d, want %d..%d", tc.name, n, tc.min, tc.max)
		}
	}
}

func TestNamedCustomers(t *testing.T) {
	db := openRO(t, sharedDB(t))
	for _, tc := range []struct {
		name        string
		id          int64
		openTickets int
	}{
		{"Acme Corp", acmeID, 3},
		{"Globex", globexID, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if id := queryInt(t, db, `SELECT id FROM customers WHERE name = ?`, tc.name); int64(id) != tc.id {
				t.Errorf("id = %d, want %d", id, tc.id)
			}
			n := queryInt(t, db, `SELECT count(*) FROM support_tickets t JOIN customers c ON c.id = t.customer_id
				WHERE c.name = ? AND t.status = 'open'`, tc.name)
			if n != tc.openTickets {
				t.Errorf("open tickets = %d, want %d", n, tc.openTickets)
			}
			if n := queryInt(t, db, `SELECT count(*) FROM orders WHERE customer_id = ?`, tc.id); n < 20 {
				t.Errorf("only %d orders", n)
			}
		})
	}
	// The failed payment demo starts from Acme Corp's failed invoices.
	if n := queryInt(t, db, `SELECT count(*) FROM invoices WHERE customer_id = ? AND status = 'failed' AND payment_attempts = ?`,
		acmeID, maxPaymentAttempts); n < plantedFailedInvoices {
		t.Errorf("Acme Corp has %d failed invoices, want at least %d", n, plantedFailedInvoices)
	}
}

func BenchmarkGenerateDB(b *testing.B) {
	dir := b.TempDir()
	for i := range b.N {
		if err := GenerateDB(b.Context(), filepath.Join(dir, fmt.Sprintf("demo-%d.db", i))); err != nil {
			b.Fatal(err)
		}
	}
}
