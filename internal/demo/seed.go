package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

// dialect is what differs between the SQL databases the demo company is
// written to: the floating-point type and the parameter placeholders.
type dialect struct {
	name string
	// float is the column type of amounts.
	float string
	// numbered placeholders ($1, $2, ...) instead of ?.
	numbered bool
}

var (
	sqlite = dialect{name: "sqlite", float: "REAL"}
	// PostgreSQL's REAL is single precision; amounts need double.
	postgres = dialect{name: "postgresql", float: "DOUBLE PRECISION", numbered: true}
)

// schema is the CREATE TABLE script in this dialect.
func (d dialect) schema() string { return fmt.Sprintf(schema, d.float) }

// bind rewrites the ? placeholders of query for this dialect. The demo's
// statements hold no ? inside string literals.
func (d dialect) bind(query string) string {
	if !d.numbered {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// demoTables are the tables the demo schema creates, meta first.
var demoTables = []string{"meta", "customers", "orders", "invoices", "support_tickets"}

// SeedResult says what SeedPostgres did.
type SeedResult string

// Seed outcomes.
const (
	// SeedCreated: the schema was empty and now holds the demo company.
	SeedCreated SeedResult = "created"
	// SeedCurrent: the schema already held the current demo company.
	SeedCurrent SeedResult = "current"
	// SeedUpgraded: an older demo company was replaced by the current one.
	SeedUpgraded SeedResult = "upgraded"
)

// SeedPostgres makes sure the current schema of the PostgreSQL database at
// dsn (postgres://user:password@host:port/db?...) holds the demo company,
// the same rows GenerateDB writes to SQLite.
//
// It is idempotent and safe to run from several processes at once (an
// init container per replica): the work happens in one transaction under
// a transaction-level advisory lock. An empty schema is filled; a schema
// holding the current demo company is left alone; one holding an older
// demo version is rebuilt. A schema holding any other table is refused
// with an error wrapping ErrNotDemoDB and left untouched.
func SeedPostgres(ctx context.Context, dsn string) (res SeedResult, err error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return "", fmt.Errorf("seed: DSN must start with postgres:// or postgresql://")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "", fmt.Errorf("seed %s: %w", redactDSN(dsn), err)
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("seed %s: %w", redactDSN(dsn), err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, tx.Rollback())
		}
	}()
	// One seeder at a time; others wait, then find the work done.
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('planex demo seed'))`); err != nil {
		return "", fmt.Errorf("seed: lock: %w", err)
	}
	res, err = seedTx(ctx, tx)
	if err != nil {
		return "", fmt.Errorf("seed %s: %w", redactDSN(dsn), err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("seed %s: commit: %w", redactDSN(dsn), err)
	}
	return res, nil
}

// seedTx inspects the current schema and writes the demo company into it
// when it is empty or holds an older demo version.
func seedTx(ctx context.Context, tx *sql.Tx) (SeedResult, error) {
	rows, err := tx.QueryContext(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() ORDER BY table_name`)
	if err != nil {
		return "", fmt.Errorf("list tables: %w", err)
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return "", fmt.Errorf("list tables: %w", err)
		}
		tables = append(tables, name)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return "", fmt.Errorf("list tables: %w", err)
	}
	var foreign []string
	for _, t := range tables {
		if !slices.Contains(demoTables, t) {
			foreign = append(foreign, t)
		}
	}
	if len(foreign) > 0 {
		return "", fmt.Errorf("%w: the schema holds other tables (%s); seed an empty database or schema", ErrNotDemoDB, strings.Join(foreign, ", "))
	}
	res := SeedCreated
	if len(tables) > 0 {
		var version string
		err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&version)
		switch {
		case err != nil && !slices.Contains(tables, "meta"):
			return "", fmt.Errorf("%w: tables %s exist without a meta table; drop them or seed an empty schema", ErrNotDemoDB, strings.Join(tables, ", "))
		case errors.Is(err, sql.ErrNoRows):
			return "", fmt.Errorf("%w: meta has no schema_version", ErrNotDemoDB)
		case err != nil:
			return "", fmt.Errorf("read meta: %w", err)
		case version == SchemaVersion && len(tables) == len(demoTables):
			return SeedCurrent, nil
		}
		// An older demo version (or a half-dropped one): rebuild.
		drop := slices.Clone(demoTables)
		slices.Reverse(drop)
		for _, t := range drop {
			if _, err := tx.ExecContext(ctx, `DROP TABLE IF EXISTS `+t+` CASCADE`); err != nil {
				return "", fmt.Errorf("drop %s: %w", t, err)
			}
		}
		res = SeedUpgraded
	}
	if _, err := tx.ExecContext(ctx, postgres.schema()); err != nil {
		return "", fmt.Errorf("create schema: %w", err)
	}
	if err := generate().insert(ctx, tx, postgres); err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, indexes); err != nil {
		return "", fmt.Errorf("create indexes: %w", err)
	}
	return res, nil
}

// redactDSN drops the password from a DSN for error messages.
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "postgres://(unparsable DSN)"
	}
	return u.Redacted()
}
