package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/tenant"
)

// tenantsCmd manages tenants (TenantService; the platform-admin role).
func tenantsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenants",
		Short: "Manage tenants: teams sharing the installation, each in a NATS account of its own (platform-admin)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(tenantsCreateCmd(), tenantsUpdateCmd(), tenantsListCmd(), tenantsGetCmd(), tenantsDeleteCmd())
	return cmd
}

// outputFlags are client flags with -o/--output (table or json; --json
// is -o json).
type outputFlags struct {
	clientFlags
	output string
}

func (f *outputFlags) register(fs *pflag.FlagSet) {
	f.clientFlags.register(fs)
	fs.StringVarP(&f.output, "output", "o", "table", "output format: table or json (--json is -o json)")
}

func (f *outputFlags) asJSON() (bool, error) {
	switch f.output {
	case "json":
		return true, nil
	case "table", "":
		return f.json, nil
	}
	return false, fmt.Errorf("--output %q: want table or json", f.output)
}

// tenantsCLI runs the subcommands of the supervisor's TenantService.
var tenantsCLI = serviceCLI[planexv1.TenantServiceClient]{newClient: planexv1.NewTenantServiceClient, rpcError: tenantRPCError}

// tenantSpecFlags are the flags of `tenants create` and `tenants update`.
type tenantSpecFlags struct {
	description       string
	pools             []string
	members           []string
	claimValues       []string
	maxConcurrentRuns int32
	startsPerSecond   float64
	startBurst        int32
	poolInFlight      []string
	tokensPerDay      int64
	moneyPerMonth     float64
	retention         time.Duration
	maxSteps          int32
	policiesFile      string
}

func (f *tenantSpecFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.description, "description", "", "free text shown in listings")
	fs.StringArrayVar(&f.pools, "pool", nil, "executor pool the tenant owns (repeatable)")
	fs.StringArrayVar(&f.members, "member", nil, "caller subject belonging to the tenant: apikey:<name>, cert:<name> or jwt:<iss>:<sub> (repeatable)")
	fs.StringArrayVar(&f.claimValues, "jwt-claim-value", nil, "value of the supervisor's --auth-jwt-tenant-claim meaning this tenant (repeatable; the tenant's name always does)")
	fs.Int32Var(&f.maxConcurrentRuns, "max-concurrent-runs", 0, "runs not finished at once (0: unlimited)")
	fs.Float64Var(&f.startsPerSecond, "starts-per-second", 0, "sustained StartRun rate (0: unlimited)")
	fs.Int32Var(&f.startBurst, "start-burst", 0, "starts allowed in a burst above the rate (0: the rate, at least 1)")
	fs.StringArrayVar(&f.poolInFlight, "pool-steps-in-flight", nil, "POOL=N: steps of POOL dispatched and not finished at once (repeatable; N 0: unlimited)")
	fs.Int64Var(&f.tokensPerDay, "tokens-per-day", 0, "model tokens per UTC day (0: unlimited)")
	fs.Float64Var(&f.moneyPerMonth, "money-per-month", 0, "model spend per UTC month in USD, priced with the supervisor's --model-prices (0: unlimited)")
	fs.DurationVar(&f.retention, "retention", 0, "how long the tenant's run logs and outputs are kept (0: the supervisor's --events-max-age)")
	fs.Int32Var(&f.maxSteps, "max-steps", 0, "largest step budget of one run of the tenant (0: the supervisor's ceiling)")
	fs.StringVar(&f.policiesFile, "policies-file", "", "the tenant's gate policies, a policy file (docs/guardrails.md); empty: the supervisor's")
}

// flagOfField maps spec fields to the flags setting them, to name the
// flag in errors.
var flagOfField = []struct{ field, flag string }{
	{"tenant.name", "NAME"},
	{"tenant.description", "--description"},
	{"tenant.pools", "--pool"},
	{"tenant.members.subjects", "--member"},
	{"tenant.members.jwt_claim_values", "--jwt-claim-value"},
	{"tenant.quotas.max_concurrent_runs", "--max-concurrent-runs"},
	{"tenant.quotas.starts_per_second", "--starts-per-second"},
	{"tenant.quotas.start_burst", "--start-burst"},
	{"tenant.quotas.pool_steps_in_flight", "--pool-steps-in-flight"},
	{"tenant.quotas.tokens_per_day", "--tokens-per-day"},
	{"tenant.quotas.money_per_month_micros", "--money-per-month"},
	{"tenant.retention", "--retention"},
	{"tenant.budget", "--max-steps"},
	{"tenant.policies", "--policies-file"},
}

// flagError names the flags of a spec error's fields.
func flagError(msg string) error {
	for _, m := range flagOfField {
		msg = strings.ReplaceAll(msg, m.field, m.flag+" ("+m.field+")")
	}
	return errors.New(msg)
}

// apply sets the spec fields of the flags given (all of them for create:
// changed reports true for every flag then).
func (f *tenantSpecFlags) apply(t *planexv1.Tenant, changed func(string) bool) error {
	if t.Members == nil {
		t.Members = &planexv1.TenantMembers{}
	}
	if t.Quotas == nil {
		t.Quotas = &planexv1.TenantQuotas{}
	}
	if changed("description") {
		t.Description = f.description
	}
	if changed("pool") {
		t.Pools = f.pools
	}
	if changed("member") {
		t.Members.Subjects = f.members
	}
	if changed("jwt-claim-value") {
		t.Members.JwtClaimValues = f.claimValues
	}
	q := t.Quotas
	if changed("max-concurrent-runs") {
		q.MaxConcurrentRuns = f.maxConcurrentRuns
	}
	if changed("starts-per-second") {
		q.StartsPerSecond = f.startsPerSecond
	}
	if changed("start-burst") {
		q.StartBurst = f.startBurst
	}
	if changed("pool-steps-in-flight") {
		q.PoolStepsInFlight = map[string]int32{}
		for _, kv := range f.poolInFlight {
			pool, n, ok := strings.Cut(kv, "=")
			v, err := strconv.ParseInt(n, 10, 32)
			if !ok || pool == "" || err != nil {
				return fmt.Errorf("--pool-steps-in-flight %q: want POOL=N, e.g. sql=4", kv)
			}
			q.PoolStepsInFlight[pool] = int32(v)
		}
	}
	if changed("tokens-per-day") {
		q.TokensPerDay = f.tokensPerDay
	}
	if changed("money-per-month") {
		if f.moneyPerMonth < 0 || math.IsNaN(f.moneyPerMonth) || f.moneyPerMonth > 1e12 {
			return fmt.Errorf("--money-per-month %v: want USD, 0 (unlimited) or more", f.moneyPerMonth)
		}
		q.MoneyPerMonthMicros = int64(math.Round(f.moneyPerMonth * 1e6))
	}
	if changed("retention") {
		if f.retention < 0 {
			return fmt.Errorf("--retention %s: want 0 (the supervisor's) or more", f.retention)
		}
		t.Retention = nil
		if f.retention > 0 {
			t.Retention = durationpb.New(f.retention)
		}
	}
	if changed("max-steps") {
		if t.Budget == nil {
			t.Budget = &planexv1.TenantBudget{}
		}
		t.Budget.MaxSteps = f.maxSteps
	}
	if changed("policies-file") {
		t.Policies = ""
		if f.policiesFile != "" {
			b, err := os.ReadFile(f.policiesFile)
			if err != nil {
				return fmt.Errorf("--policies-file: %w", err)
			}
			t.Policies = string(b)
		}
	}
	if proto.Equal(t.Members, &planexv1.TenantMembers{}) {
		t.Members = nil
	}
	if proto.Equal(t.Quotas, &planexv1.TenantQuotas{}) {
		t.Quotas = nil
	}
	if err := tenant.Validate(t); err != nil {
		return flagError(err.Error())
	}
	return nil
}

func tenantsCreateCmd() *cobra.Command {
	var (
		of   outputFlags
		spec tenantSpecFlags
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tenant (its NATS account must exist; `planex dev` creates it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t := &planexv1.Tenant{Name: args[0]}
			check := func() error { return spec.apply(t, func(string) bool { return true }) }
			return tenantsCLI.run(cmd, &of, check, func(ctx context.Context, client planexv1.TenantServiceClient, asJSON bool) error {
				resp, err := client.CreateTenant(ctx, &planexv1.CreateTenantRequest{Tenant: t})
				if err != nil {
					return err
				}
				return printTenant(cmd.OutOrStdout(), resp.GetTenant(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	spec.register(cmd.Flags())
	return cmd
}

func tenantsUpdateCmd() *cobra.Command {
	var (
		of   outputFlags
		spec tenantSpecFlags
	)
	cmd := &cobra.Command{
		Use:   "update NAME",
		Short: "Change a tenant: only the flags given (read, modify, write with its revision)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return tenantsCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.TenantServiceClient, asJSON bool) error {
				got, err := client.GetTenant(ctx, &planexv1.GetTenantRequest{Name: args[0]})
				if err != nil {
					return err
				}
				t := got.GetTenant()
				if err := spec.apply(t, cmd.Flags().Changed); err != nil {
					return err
				}
				resp, err := client.UpdateTenant(ctx, &planexv1.UpdateTenantRequest{Tenant: t})
				if err != nil {
					return err
				}
				return printTenant(cmd.OutOrStdout(), resp.GetTenant(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	spec.register(cmd.Flags())
	return cmd
}

func tenantsListCmd() *cobra.Command {
	var of outputFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tenants, default first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return tenantsCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.TenantServiceClient, asJSON bool) error {
				resp, err := client.ListTenants(ctx, &planexv1.ListTenantsRequest{})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tREADY\tPOOLS\tQUOTAS")
				for _, t := range resp.GetTenants() {
					ready := "yes"
					if !t.GetReady() {
						ready = "no: " + oneLineText(t.GetNotReadyReason(), 60)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.GetName(), ready, orDash(strings.Join(t.GetPools(), ",")), quotaSummary(t.GetQuotas()))
				}
				return tw.Flush()
			})
		},
	}
	of.register(cmd.Flags())
	return cmd
}

func tenantsGetCmd() *cobra.Command {
	var of outputFlags
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a tenant",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return tenantsCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.TenantServiceClient, asJSON bool) error {
				resp, err := client.GetTenant(ctx, &planexv1.GetTenantRequest{Name: args[0]})
				if err != nil {
					return err
				}
				return printTenant(cmd.OutOrStdout(), resp.GetTenant(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	return cmd
}

func tenantsDeleteCmd() *cobra.Command {
	var (
		cf    clientFlags
		force bool
	)
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a tenant: its callers are refused from then on (its NATS account and data stay)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return tenantsCLI.do(cmd, cf.addr, func(ctx context.Context, client planexv1.TenantServiceClient) error {
				if _, err := client.DeleteTenant(ctx, &planexv1.DeleteTenantRequest{Name: args[0], Force: force}); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "tenant %s deleted\n", args[0])
				return nil
			})
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().BoolVar(&force, "force", false, "delete even while the tenant has runs that have not finished (they stop being served)")
	return cmd
}

// usageCmd reports a tenant's usage per day.
func usageCmd() *cobra.Command {
	var (
		of       outputFlags
		name     string
		from, to string
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show a tenant's runs, steps, model tokens and cost per day, and its quotas (default: your tenant)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			check := func() error { return checkDays(from, to) }
			return tenantsCLI.run(cmd, &of, check, func(ctx context.Context, client planexv1.TenantServiceClient, asJSON bool) error {
				resp, err := client.GetUsage(ctx, &planexv1.GetUsageRequest{Tenant: name, FromDay: from, ToDay: to})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				return printUsage(cmd.OutOrStdout(), resp)
			})
		},
	}
	of.register(cmd.Flags())
	cmd.Flags().StringVar(&name, "tenant", "", "tenant to report (default: yours; another's needs platform-admin)")
	cmd.Flags().StringVar(&from, "from", "", "first UTC day, YYYY-MM-DD (default: 30 days ago)")
	cmd.Flags().StringVar(&to, "to", "", "last UTC day, YYYY-MM-DD, inclusive (default: today)")
	return cmd
}

// checkDays validates `usage --from` and `--to` (empty: the default).
func checkDays(from, to string) error {
	for _, d := range []struct{ flag, v string }{{"--from", from}, {"--to", to}} {
		if d.v != "" {
			if _, err := time.Parse(time.DateOnly, d.v); err != nil {
				return fmt.Errorf("%s %q: want a UTC day YYYY-MM-DD", d.flag, d.v)
			}
		}
	}
	return nil
}

// tenantRPCError is rpcError with TenantService's refusals explained:
// nil for nil, an error that is not a gRPC status unchanged.
func tenantRPCError(addr string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.PermissionDenied:
		if strings.Contains(st.Message(), "platform-admin") || strings.HasPrefix(st.Message(), "permission denied") {
			return fmt.Errorf("permission denied by the supervisor at %s: managing tenants needs the platform-admin role (of the default tenant): %s", addr, st.Message())
		}
		return fmt.Errorf("permission denied by the supervisor at %s: %s", addr, st.Message())
	case codes.InvalidArgument:
		return flagError(st.Message())
	case codes.NotFound, codes.AlreadyExists, codes.Aborted, codes.FailedPrecondition:
		return errors.New(st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("the supervisor at %s does not serve tenants (an earlier release)", addr)
	}
	return rpcError(addr, err)
}

func printTenant(w io.Writer, t *planexv1.Tenant, asJSON bool) error {
	if asJSON {
		return printJSON(w, t)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	ready := "yes"
	if !t.GetReady() {
		ready = "no: " + t.GetNotReadyReason()
	}
	fmt.Fprintf(tw, "name:\t%s\n", t.GetName())
	if t.GetDescription() != "" {
		fmt.Fprintf(tw, "description:\t%s\n", t.GetDescription())
	}
	fmt.Fprintf(tw, "ready:\t%s\n", ready)
	fmt.Fprintf(tw, "nats account:\t%s\n", t.GetNatsAccount())
	fmt.Fprintf(tw, "pools:\t%s\n", orDash(strings.Join(t.GetPools(), ", ")))
	if m := t.GetMembers(); len(m.GetSubjects())+len(m.GetJwtClaimValues()) > 0 {
		fmt.Fprintf(tw, "members:\t%s\n", orDash(strings.Join(m.GetSubjects(), ", ")))
		fmt.Fprintf(tw, "jwt claim values:\t%s\n", orDash(strings.Join(m.GetJwtClaimValues(), ", ")))
	}
	fmt.Fprintf(tw, "quotas:\t%s\n", quotaSummary(t.GetQuotas()))
	if r := t.GetRetention(); r != nil {
		fmt.Fprintf(tw, "retention:\t%s\n", r.AsDuration())
	}
	if b := t.GetBudget(); b != nil {
		var parts []string
		if n := b.GetMaxSteps(); n > 0 {
			parts = append(parts, fmt.Sprintf("max steps %d", n))
		}
		if n := b.GetMaxTokens(); n > 0 {
			parts = append(parts, fmt.Sprintf("max tokens %d", n))
		}
		if d := b.GetMaxDuration().AsDuration(); d > 0 {
			parts = append(parts, fmt.Sprintf("max duration %s", d))
		}
		if len(parts) > 0 {
			fmt.Fprintf(tw, "budget:\t%s (the rest: the supervisor's ceilings)\n", strings.Join(parts, ", "))
		}
	}
	if t.GetPolicies() != "" {
		fmt.Fprintf(tw, "policies:\t%d lines (-o json shows them)\n", strings.Count(strings.TrimRight(t.GetPolicies(), "\n"), "\n")+1)
	}
	if t.GetRevision() != 0 {
		fmt.Fprintf(tw, "revision:\t%d\n", t.GetRevision())
	}
	return tw.Flush()
}

// quotaSummary is a tenant's quotas on one line ("-": none).
func quotaSummary(q *planexv1.TenantQuotas) string {
	var parts []string
	if n := q.GetMaxConcurrentRuns(); n > 0 {
		parts = append(parts, fmt.Sprintf("%d runs at once", n))
	}
	if r := q.GetStartsPerSecond(); r > 0 {
		s := strconv.FormatFloat(r, 'f', -1, 64) + " starts/s"
		if b := q.GetStartBurst(); b > 0 {
			s += fmt.Sprintf(" (burst %d)", b)
		}
		parts = append(parts, s)
	}
	pools := make([]string, 0, len(q.GetPoolStepsInFlight()))
	for p := range q.GetPoolStepsInFlight() {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	for _, p := range pools {
		if n := q.GetPoolStepsInFlight()[p]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d steps", p, n))
		}
	}
	if n := q.GetTokensPerDay(); n > 0 {
		parts = append(parts, fmt.Sprintf("%d tokens/day", n))
	}
	if n := q.GetMoneyPerMonthMicros(); n > 0 {
		parts = append(parts, "$"+usd(n)+"/month")
	}
	return orDash(strings.Join(parts, ", "))
}

// usd formats micro-dollars as dollars.
func usd(micros int64) string {
	return strconv.FormatFloat(float64(micros)/1e6, 'f', 2, 64)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printUsage(w io.Writer, u *planexv1.GetUsageResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "tenant %s\n", u.GetTenant())
	fmt.Fprintln(tw, "DAY\tRUNS STARTED\tRUNS FINISHED\tSTEPS\tINPUT TOKENS\tOUTPUT TOKENS\tCOST USD")
	row := func(day string, d *planexv1.UsageDay) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", day, d.GetRunsStarted(), d.GetRunsFinished(), d.GetSteps(),
			d.GetInputTokens(), d.GetOutputTokens(), usd(d.GetCostMicros()))
	}
	for _, d := range u.GetDays() {
		row(d.GetDay(), d)
	}
	row("total", u.GetTotal())
	if err := tw.Flush(); err != nil {
		return err
	}
	q := u.GetQuotas()
	limit := func(n int64, f func(int64) string) string {
		if n <= 0 {
			return "unlimited"
		}
		return f(n)
	}
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	fmt.Fprintf(w, "run trees in flight: %d of %s (runs, children included: %d)\n", u.GetRunTreesInFlight(), limit(int64(q.GetMaxConcurrentRuns()), itoa), u.GetRunsInFlight())
	fmt.Fprintf(w, "tokens today: %d of %s\n", u.GetTokensToday(), limit(q.GetTokensPerDay(), itoa))
	fmt.Fprintf(w, "spent this month: $%s of %s\n", usd(u.GetMoneyThisMonthMicros()), limit(q.GetMoneyPerMonthMicros(), func(n int64) string { return "$" + usd(n) }))
	return nil
}
