// Package tenant is planex's tenant model: the registry of tenants (a KV
// bucket in the default tenant's NATS account), the validation of a
// tenant's spec, and which tenant an authenticated caller belongs to.
//
// A tenant's runs, tools, gates, policies and usage live in a NATS account
// of its own (internal/natsauth.TenantAccount), which the supervisor serves
// with an engine and API of their own; this package only names tenants and
// maps callers to them. The implicit tenant "default" (authn.DefaultTenant)
// is the installation as it was before tenants: it is never stored, always
// exists and cannot be deleted.
package tenant

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/policy"
)

// Default is the implicit tenant.
const Default = authn.DefaultTenant

// ValidName checks a tenant name (field "name"): lower-case letters,
// digits and '-', starting with a letter, at most 31 characters.
func ValidName(name string) error {
	return authn.ValidTenant(name)
}

// Validate checks a spec to be stored (output-only fields are ignored),
// naming the field at fault.
func Validate(t *planexv1.Tenant) error {
	if t == nil {
		return errors.New("tenant: required")
	}
	var errs []error
	if err := ValidName(t.GetName()); err != nil {
		errs = append(errs, fmt.Errorf("tenant.name: %w", err))
	} else if t.GetName() == Default {
		errs = append(errs, fmt.Errorf("tenant.name: %q is the implicit tenant: it is not created, updated or deleted", Default))
	}
	if len(t.GetDescription()) > 1024 {
		errs = append(errs, errors.New("tenant.description: at most 1024 bytes"))
	}
	seen := map[string]bool{}
	for i, p := range t.GetPools() {
		if !bus.ValidToken(p) || strings.Contains(p, ".") {
			errs = append(errs, fmt.Errorf("tenant.pools[%d]: %q: want a pool name (letters, digits, '-' or '_')", i, p))
		}
		if seen[p] {
			errs = append(errs, fmt.Errorf("tenant.pools[%d]: %q listed twice", i, p))
		}
		seen[p] = true
	}
	for i, v := range t.GetMembers().GetJwtClaimValues() {
		if strings.TrimSpace(v) == "" || len(v) > 256 {
			errs = append(errs, fmt.Errorf("tenant.members.jwt_claim_values[%d]: want 1 to 256 bytes", i))
		}
	}
	for i, s := range t.GetMembers().GetSubjects() {
		if !strings.HasPrefix(s, authn.SubjectAPIKey) && !strings.HasPrefix(s, authn.SubjectCert) && !strings.HasPrefix(s, authn.SubjectJWT) {
			errs = append(errs, fmt.Errorf("tenant.members.subjects[%d]: %q: want apikey:<name>, cert:<name> or jwt:<iss>:<sub>", i, s))
		}
	}
	q := t.GetQuotas()
	switch {
	case q.GetMaxConcurrentRuns() < 0:
		errs = append(errs, errors.New("tenant.quotas.max_concurrent_runs: must not be negative"))
	case q.GetStartsPerSecond() < 0 || q.GetStartsPerSecond() > 1e6:
		errs = append(errs, errors.New("tenant.quotas.starts_per_second: want 0 (unlimited) to 1,000,000"))
	case q.GetStartBurst() < 0:
		errs = append(errs, errors.New("tenant.quotas.start_burst: must not be negative"))
	case q.GetTokensPerDay() < 0:
		errs = append(errs, errors.New("tenant.quotas.tokens_per_day: must not be negative"))
	case q.GetMoneyPerMonthMicros() < 0:
		errs = append(errs, errors.New("tenant.quotas.money_per_month_micros: must not be negative"))
	}
	for pool, n := range q.GetPoolStepsInFlight() {
		if !bus.ValidToken(pool) || strings.Contains(pool, ".") {
			errs = append(errs, fmt.Errorf("tenant.quotas.pool_steps_in_flight: key %q: want a pool name", pool))
		}
		if n < 0 {
			errs = append(errs, fmt.Errorf("tenant.quotas.pool_steps_in_flight[%s]: must not be negative", pool))
		}
	}
	if r := t.GetRetention(); r != nil && (r.CheckValid() != nil || r.AsDuration() < 0) {
		errs = append(errs, errors.New("tenant.retention: want a duration of 0 or more"))
	}
	b := t.GetBudget()
	if b.GetMaxSteps() < 0 || b.GetMaxTokens() < 0 || (b.GetMaxDuration() != nil && b.GetMaxDuration().AsDuration() < 0) {
		errs = append(errs, errors.New("tenant.budget: fields must not be negative"))
	}
	if t.GetPolicies() != "" {
		if _, err := policy.Parse("tenant.policies", []byte(t.GetPolicies())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ErrUnknownTenant is returned by Resolve when a credential names a tenant
// that is not registered: the caller is refused (fail closed), never put in
// the default tenant.
var ErrUnknownTenant = errors.New("the credential names a tenant that is not registered")

// Resolve returns the tenant id belongs to, given the registered tenants:
//
//  1. a credential naming a tenant (API key line, JWT tenant claim) belongs
//     to the tenant of that name or listing the value in
//     members.jwt_claim_values; naming none registered is ErrUnknownTenant;
//  2. else the tenant listing id's subject in members.subjects;
//  3. else the default tenant.
func Resolve(id authn.Identity, tenants []*planexv1.Tenant) (string, error) {
	if id.Tenant != "" {
		if id.Tenant == Default {
			return Default, nil
		}
		for _, t := range tenants {
			if t.GetName() == id.Tenant || slices.Contains(t.GetMembers().GetJwtClaimValues(), id.Tenant) {
				return t.GetName(), nil
			}
		}
		return "", fmt.Errorf("%w: %q", ErrUnknownTenant, id.Tenant)
	}
	for _, t := range tenants {
		if slices.ContainsFunc(t.GetMembers().GetSubjects(), id.Matches) {
			return t.GetName(), nil
		}
	}
	return Default, nil
}
