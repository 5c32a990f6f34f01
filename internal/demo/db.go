package demo

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver (pure Go)
)

// SchemaVersion is the layout version GenerateDB records under the key
// "schema_version" in the meta table. It changes whenever the schema or the
// generated data change, so that data dirs holding an older demo database
// are rebuilt on the next start.
const SchemaVersion = "1"

// AsOf is the demo company's "today", as an ISO date: generated activity
// ends on this day, pending orders and open tickets are recent relative to
// it, and an invoice is overdue when its due date is before it. Demo goals
// should say "in 2025" or "as of AsOf" rather than rely on the real clock.
const AsOf = "2025-12-31"

// ErrNotDemoDB is returned, wrapped, by GenerateDB when a file already exists
// at the path but is not a planex demo database of any version: not SQLite,
// truncated, corrupt, or somebody else's database. GenerateDB leaves such a
// file untouched rather than risk destroying data; remove it to regenerate.
var ErrNotDemoDB = errors.New("not a planex demo database")

// sqliteMagic opens every SQLite 3 database file.
var sqliteMagic = []byte("SQLite format 3\x00")

// schema creates the demo tables; %[1]s is the dialect's floating-point
// type. Column comments are kept by SQLite in sqlite_master, so a planner
// that reads the schema sees them too.
const schema = `
CREATE TABLE meta (
	key   TEXT PRIMARY KEY,
	value TEXT
);

CREATE TABLE customers (
	id         INTEGER PRIMARY KEY,
	name       TEXT UNIQUE NOT NULL,
	region     TEXT NOT NULL,  -- EMEA | NA | APAC | LATAM
	segment    TEXT NOT NULL,  -- enterprise | mid-market | smb
	created_at TEXT            -- ISO date YYYY-MM-DD
);

CREATE TABLE orders (
	id          INTEGER PRIMARY KEY,
	customer_id INTEGER NOT NULL REFERENCES customers(id),
	ordered_at  TEXT NOT NULL,  -- ISO date YYYY-MM-DD
	amount      %[1]s NOT NULL,  -- USD
	status      TEXT NOT NULL CHECK (status IN ('completed', 'refunded', 'pending'))
);

CREATE TABLE invoices (
	id               INTEGER PRIMARY KEY,
	order_id         INTEGER NOT NULL REFERENCES orders(id),
	customer_id      INTEGER NOT NULL REFERENCES customers(id),
	issued_at        TEXT,     -- ISO date YYYY-MM-DD
	due_at           TEXT,     -- ISO date YYYY-MM-DD
	amount           %[1]s,     -- USD
	status           TEXT CHECK (status IN ('paid', 'open', 'overdue', 'failed')),
	payment_attempts INTEGER   -- card charges tried so far
);

CREATE TABLE support_tickets (
	id          INTEGER PRIMARY KEY,
	customer_id INTEGER NOT NULL REFERENCES customers(id),
	opened_at   TEXT,           -- YYYY-MM-DD HH:MM:SS, UTC
	closed_at   TEXT NULL,      -- YYYY-MM-DD HH:MM:SS, UTC; NULL unless closed
	status      TEXT NOT NULL CHECK (status IN ('open', 'pending', 'closed')),
	priority    TEXT CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
	subject     TEXT
);
`

// indexes cover the foreign keys and dates. They are created after the rows
// are in, which is faster than maintaining them row by row.
const indexes = `
CREATE INDEX orders_customer_id ON orders(customer_id);
CREATE INDEX orders_ordered_at ON orders(ordered_at);
CREATE INDEX invoices_order_id ON invoices(order_id);
CREATE INDEX invoices_customer_id ON invoices(customer_id);
CREATE INDEX invoices_issued_at ON invoices(issued_at);
CREATE INDEX invoices_due_at ON invoices(due_at);
CREATE INDEX support_tickets_customer_id ON support_tickets(customer_id);
CREATE INDEX support_tickets_opened_at ON support_tickets(opened_at);
`

// GenerateDB makes sure path holds the current demo database.
//
// When path does not exist, GenerateDB generates the database into a
// temporary file in the same directory (creating the directory if needed)
// and renames it into place, so a crash never leaves a half-built database
// at path. When path already holds a demo database of SchemaVersion it does
// nothing; when it holds a demo database of another version it rebuilds it
// the same way. Any other existing file is left alone and reported with an
// error wrapping ErrNotDemoDB.
//
// The content depends on nothing but this package's code: two calls on two
// machines produce the same rows.
func GenerateDB(ctx context.Context, path string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("demo db %s: %w", path, err)
	}
	current, err := inspectDB(ctx, path)
	if err != nil || current {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("demo db: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("demo db: %w", err)
	}
	tmpPath := tmp.Name()
	if err := tmp.Close(); err != nil {
		return errors.Join(fmt.Errorf("demo db: %w", err), removeTemp(tmpPath))
	}
	if err := buildDB(ctx, tmpPath); err != nil {
		return errors.Join(fmt.Errorf("demo db %s: %w", path, err), removeTemp(tmpPath))
	}
	if err := os.Rename(tmpPath, path); err != nil {
		return errors.Join(fmt.Errorf("demo db: %w", err), removeTemp(tmpPath))
	}
	syncDir(dir)
	return nil
}

// inspectDB reports whether path already holds the current demo database.
// It returns false, nil when path is absent or holds an older demo
// database, both of which GenerateDB may (re)write.
func inspectDB(ctx context.Context, path string) (current bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("demo db: %w", err)
	}
	header, err := readHeader(f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("demo db: %w", err)
	}
	if !bytes.Equal(header, sqliteMagic) {
		return false, fmt.Errorf("demo db %s: %w (no SQLite header; remove the file to regenerate it)", path, ErrNotDemoDB)
	}

	db, err := sql.Open("sqlite", sqliteURI(path, "ro"))
	if err != nil {
		return false, fmt.Errorf("demo db %s: %w", path, err)
	}
	defer db.Close()
	var version string
	err = db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&version)
	switch {
	case ctx.Err() != nil:
		return false, fmt.Errorf("demo db %s: %w", path, ctx.Err())
	case errors.Is(err, sql.ErrNoRows):
		return false, fmt.Errorf("demo db %s: %w (meta has no schema_version; remove the file to regenerate it)", path, ErrNotDemoDB)
	case err != nil:
		return false, fmt.Errorf("demo db %s: %w (remove the file to regenerate it): %v", path, ErrNotDemoDB, err)
	}
	return version == SchemaVersion, nil
}

// readHeader returns the first bytes of f, as many as sqliteMagic has, or
// fewer when the file is shorter.
func readHeader(f *os.File) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory", f.Name())
	}
	header := make([]byte, len(sqliteMagic))
	n, err := io.ReadFull(f, header)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	return header[:n], err
}

// buildDB writes the schema and the generated rows into the (empty) SQLite
// file at path in one transaction.
func buildDB(ctx context.Context, path string) (err error) {
	db, err := sql.Open("sqlite", sqliteURI(path, "rw"))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	// One connection, so the pragmas below hold for the transaction. The
	// file is private to this call until the rename and is deleted on any
	// error, so SQLite need not make it crash-safe: sync once at the end.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, `PRAGMA journal_mode = MEMORY; PRAGMA synchronous = OFF`); err != nil {
		return err
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, tx.Rollback())
		}
	}()
	if _, err := tx.ExecContext(ctx, sqlite.schema()); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if err := generate().insert(ctx, tx, sqlite); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, indexes); err != nil {
		return fmt.Errorf("create indexes: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	return syncFile(path)
}

// syncFile flushes a file's content to stable storage.
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}

// sqliteURI turns a file path into a SQLite URI with the given access mode
// ("ro" or "rw"), escaping characters such as '?' and '#' that a plain path
// would lose. The driver passes "file:" names to SQLite whole.
func sqliteURI(path, mode string) string {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path), RawQuery: "mode=" + mode}
	if u.Path[0] != '/' { // Windows drive letter: file:///C:/...
		u.Path = "/" + u.Path
	}
	return u.String()
}

// removeTemp deletes a temporary database and the rollback journal SQLite
// may have left next to it.
func removeTemp(path string) error {
	var errs []error
	for _, p := range []string{path, path + "-journal"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncDir flushes a directory entry after a rename. It is best effort: some
// platforms cannot sync directories, and the database itself is already
// durable, so a failure here only weakens crash safety of the rename.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	_ = d.Close()
}
