package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/services/executor/emailpool"
	"github.com/planex-dev/planex/services/executor/searchpool"
)

// readOutbox lists the dev outbox in dir. A directory that does not exist
// is an error naming it (a mistyped --dir must not look like an empty
// outbox); flag is the flag that named it, "" for the default.
func readOutbox(dir, flag string) ([]emailpool.OutboxMessage, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist) && flag != "":
		return nil, fmt.Errorf("%s %s: no such directory", flag, dir)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("outbox %s: no such directory; no dev stack has run on its data directory yet (planex dev or planex run --dev creates it), or give --dir", dir)
	case err != nil:
		return nil, fmt.Errorf("outbox %s: %w", dir, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("%s %s: not a directory", cmpOr(flag, "outbox"), dir)
	}
	return emailpool.ListOutbox(dir)
}

// cmpOr is a when it is not empty, else b.
func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// demoCmd groups the commands that lay out the demo company outside
// `planex dev`: in a cluster's PostgreSQL and search index.
func demoCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Lay out the demo company (database, runbooks) for the demo playbooks",
	}
	cmd.AddCommand(demoSeedCmd())
	return cmd
}

func demoSeedCmd() *cobra.Command {
	var dsn, index string
	cmd := &cobra.Command{
		Use:   "seed",
		Short: "Load the demo company into a database (--sql-dsn) and/or a search index (--search-index); idempotent",
		Long: `Load the demo company that the built-in demo playbooks (--playbooks builtin:demo) work on.

--sql-dsn postgres://... fills the current schema of a PostgreSQL database;
a SQLite path writes a demo database file. Running it again changes nothing;
an older demo version is rebuilt; a schema or file holding anything else is
refused and left untouched.

--search-index DIR indexes the demo runbooks into a new bleve index; an
existing index is left alone.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dsn == "" && index == "" {
				return errors.New("--sql-dsn or --search-index: give at least one")
			}
			out := cmd.OutOrStdout()
			if dsn != "" {
				if err := seedSQL(cmd, dsn); err != nil {
					return err
				}
			}
			if index != "" {
				n, err := seedIndex(cmd, index)
				if err != nil {
					return fmt.Errorf("--search-index %s: %w", index, err)
				}
				if n < 0 {
					fmt.Fprintf(out, "search index %s: exists, left alone\n", index)
				} else {
					fmt.Fprintf(out, "search index %s: %d runbooks indexed\n", index, n)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dsn, "sql-dsn", "", "database to seed: postgres://user:password@host:5432/db or a SQLite file path")
	cmd.Flags().StringVar(&index, "search-index", "", "bleve index directory to create with the demo runbooks")
	return cmd
}

func seedSQL(cmd *cobra.Command, dsn string) error {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		res, err := demo.SeedPostgres(cmd.Context(), dsn)
		if err != nil {
			return fmt.Errorf("--sql-dsn: %w", err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "database: demo company %s (schema version %s)\n", res, demo.SchemaVersion)
		return nil
	}
	if strings.Contains(dsn, "://") && !strings.HasPrefix(dsn, "sqlite://") {
		return fmt.Errorf("--sql-dsn: want postgres://..., sqlite:///path or a file path")
	}
	path := strings.TrimPrefix(dsn, "sqlite://")
	if err := demo.GenerateDB(cmd.Context(), path); err != nil {
		return fmt.Errorf("--sql-dsn: %w", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "database %s: demo company current (schema version %s)\n", path, demo.SchemaVersion)
	return nil
}

// seedIndex indexes the demo runbooks into dir unless it already holds an
// index; it returns -1 when it left an existing index alone.
func seedIndex(cmd *cobra.Command, dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	switch {
	case err == nil && len(entries) > 0:
		return -1, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return 0, err
	}
	var docs []searchpool.Document
	for _, d := range demo.Runbooks() {
		docs = append(docs, searchpool.Document{ID: d.ID, Title: d.Title, Body: d.Body, Tags: d.Tags})
	}
	if err == nil {
		// An empty directory (a fresh volume): bleve wants to create it.
		if err := os.Remove(dir); err != nil {
			return 0, err
		}
	}
	return searchpool.IndexDocuments(cmd.Context(), dir, docs)
}
