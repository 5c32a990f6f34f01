package playbook_test

import (
	"context"
	"fmt"
	"testing/fstest"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/planner/playbook"
)

func ExampleLoad() {
	files := fstest.MapFS{"tickets.yaml": {Data: []byte(`
name: open-tickets
description: Count the open support tickets of one customer
match:
  - '(?i)^how many open tickets does (?P<customer>.+?) have\??$'
params:
  customer: {required: true}
steps:
  - id: count
    tool: sql.query
    args:
      sql: SELECT count(*) FROM support_tickets t JOIN customers c ON c.id = t.customer_id WHERE c.name = ? AND t.status = 'open'
      params: ["${{ params.customer }}"]
answer: params.customer + ' has ' + string(int(steps.count.output.rows[0][0])) + ' open tickets'
`)}}
	set, err := playbook.Load(playbook.Source{FS: files, Name: "playbooks"})
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: "How many open tickets does Acme Corp have?", Revision: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	p := resp.GetPlan()
	fmt.Println(p.GetRationale())
	fmt.Println(p.GetSteps()[0].GetArgs().GetFields()["params"].GetListValue().GetValues()[0].GetStringValue())
	fmt.Println(p.GetAnswer())
	// Output:
	// playbook open-tickets: Count the open support tickets of one customer
	// Acme Corp
	// "Acme Corp" + ' has ' + string(int(steps.count.output.rows[0][0])) + ' open tickets'
}
