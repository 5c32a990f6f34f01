package demo

import "strings"

// Mailboxes of the demo company. They are the only recipients the demo's
// email policy allows, and all of them belong to AllowedDomains.
const (
	// AccountTeam receives customer-facing follow-ups (escalations, failed
	// payments, renewals).
	AccountTeam = "account-team@example.com"
	// Oncall reaches the engineer on call for incidents and alerts.
	Oncall = "oncall@example.com"
	// Finance handles refunds, disputes and payments that exhausted their
	// retries.
	Finance = "finance@example.com"
)

// AllowedDomains lists the email domains the demo allows outgoing mail to.
// example.com is reserved by RFC 2606, so demo mail can never reach a real
// mailbox. Callers must not modify it.
var AllowedDomains = []string{"example.com"}

// teamAliases maps normalized natural names (see normalizeTeamName) to
// mailboxes.
var teamAliases = map[string]string{
	"account team":     AccountTeam,
	"accounts team":    AccountTeam,
	"account":          AccountTeam,
	"accounts":         AccountTeam,
	"oncall":           Oncall,
	"on call":          Oncall,
	"oncall team":      Oncall,
	"on call team":     Oncall,
	"oncall engineer":  Oncall,
	"on call engineer": Oncall,
	"finance":          Finance,
	"finance team":     Finance,
	AccountTeam:        AccountTeam,
	Oncall:             Oncall,
	Finance:            Finance,
}

// TeamAddress maps a natural team name, as a goal or a planner would write
// it ("account team", "on-call", "the finance team", "Oncall"), to the team's
// mailbox. Case, surrounding space, hyphens, underscores and a leading "the"
// do not matter; an address of one of the teams maps to itself. The boolean
// is false for a name that names no demo team.
func TeamAddress(name string) (string, bool) {
	addr, ok := teamAliases[normalizeTeamName(name)]
	return addr, ok
}

// normalizeTeamName lowercases name, turns hyphens and underscores into
// spaces, collapses runs of space and drops a leading "the". Addresses pass
// through unchanged apart from case.
func normalizeTeamName(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	if strings.Contains(name, "@") {
		return name
	}
	name = strings.NewReplacer("-", " ", "_", " ").Replace(name)
	name = strings.Join(strings.Fields(name), " ")
	return strings.TrimPrefix(name, "the ")
}
