package demo_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/planex-dev/planex/internal/demo"
)

func ExampleGenerateDB() {
	dir, err := os.MkdirTemp("", "planex-demo")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "demo.db")

	ctx := context.Background()
	if err := demo.GenerateDB(ctx, path); err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	var open int
	err = db.QueryRowContext(ctx, `
		SELECT count(*) FROM support_tickets t JOIN customers c ON c.id = t.customer_id
		WHERE c.name = 'Acme Corp' AND t.status = 'open'`).Scan(&open)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("Acme Corp open tickets:", open)
	// Output: Acme Corp open tickets: 3
}

func ExampleTeamAddress() {
	for _, name := range []string{"account team", "On-Call", "the finance team", "legal"} {
		addr, ok := demo.TeamAddress(name)
		fmt.Printf("%q -> %q %v\n", name, addr, ok)
	}
	// Output:
	// "account team" -> "account-team@example.com" true
	// "On-Call" -> "oncall@example.com" true
	// "the finance team" -> "finance@example.com" true
	// "legal" -> "" false
}
