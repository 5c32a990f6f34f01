package demo

import (
	"strings"
	"testing"
)

func TestTeamAddress(t *testing.T) {
	for _, tc := range []struct {
		name   string
		want   string
		wantOK bool
	}{
		{"account team", AccountTeam, true},
		{"Account Team", AccountTeam, true},
		{"the account team", AccountTeam, true},
		{"account-team", AccountTeam, true},
		{"  accounts  team ", AccountTeam, true},
		{"oncall", Oncall, true},
		{"on-call", Oncall, true},
		{"On Call", Oncall, true},
		{"the on-call engineer", Oncall, true},
		{"finance", Finance, true},
		{"finance team", Finance, true},
		{"Finance@Example.com", Finance, true},
		{"oncall@example.com", Oncall, true},
		{"legal", "", false},
		{"", "", false},
		{"finance@evil.example", "", false},
		{"the", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := TeamAddress(tc.name)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("TeamAddress(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestTeamAddressesAreAllowed(t *testing.T) {
	for _, addr := range []string{AccountTeam, Oncall, Finance} {
		_, domain, _ := strings.Cut(addr, "@")
		if len(AllowedDomains) != 1 || domain != AllowedDomains[0] {
			t.Errorf("%s is not in AllowedDomains %v", addr, AllowedDomains)
		}
	}
}
