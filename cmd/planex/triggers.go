package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/trigger"
)

// triggersCmd manages event triggers (TriggerService, docs/triggers.md).
func triggersCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "triggers",
		Short: "Manage event triggers: NATS subjects and webhooks that start runs (docs/triggers.md)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(triggersCreateCmd(), triggersUpdateCmd(), triggersListCmd(), triggersGetCmd(),
		triggersNameCmd("pause", "Pause a trigger: its events are counted as filtered until resumed"),
		triggersNameCmd("resume", "Resume a paused trigger"),
		triggersNameCmd("delete", "Delete a trigger with its counters and rejection records"),
		triggersRejectionsCmd(), triggersFireCmd())
	return cmd
}

// triggersCLI runs the subcommands of the supervisor's TriggerService.
var triggersCLI = serviceCLI[planexv1.TriggerServiceClient]{newClient: planexv1.NewTriggerServiceClient, rpcError: triggerRPCError}

// triggerSpecFlags are the flags of `triggers create` and `update`.
type triggerSpecFlags struct {
	description, subject, filter, goal, inputs, key string
	labels                                          []string
	webhook                                         bool
	scheme, secretRef                               string
	tolerance                                       int32
}

func (f *triggerSpecFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.description, "description", "", "free text shown in listings")
	fs.StringVar(&f.subject, "subject", "", "NATS subject of the events, under "+trigger.SubjectPrefix+" (wildcards * and > allowed without --webhook)")
	fs.StringVar(&f.filter, "filter", "", "CEL bool over event, subject and headers; false: the event is counted as filtered (empty: every event)")
	fs.StringVar(&f.goal, "goal", "", `CEL string: the run's goal, e.g. '"Triage issue " + event.issue.title'`)
	fs.StringVar(&f.inputs, "inputs", "", `CEL map: the run's inputs, e.g. '{"issue": event.issue}' (empty: none)`)
	fs.StringArrayVar(&f.labels, "label", nil, "KEY=CEL string expression of a run label (repeatable)")
	fs.StringVar(&f.key, "idempotency-key", "", "CEL string identifying the event (required), e.g. event.id or headers[\"X-GitHub-Delivery\"]")
	fs.BoolVar(&f.webhook, "webhook", false, "accept the events over HTTP too: POST /v1/hooks/<tenant>/<name> on the supervisor's --webhook-addr")
	fs.StringVar(&f.scheme, "webhook-scheme", "github", "webhook signature scheme: github (X-Hub-Signature-256) or stripe (Stripe-Signature)")
	fs.StringVar(&f.secretRef, "webhook-secret-ref", "", "file name of the webhook's secret in the supervisor's --webhook-secrets-dir")
	fs.Int32Var(&f.tolerance, "webhook-tolerance-seconds", 0, "stripe scheme: largest age of a signature's timestamp (0: 300)")
}

// triggerFlagOfField maps spec fields to their flags, to name the flag in
// errors.
var triggerFlagOfField = []struct{ field, flag string }{
	{"trigger.name", "NAME"},
	{"trigger.description", "--description"},
	{"trigger.subject", "--subject"},
	{"trigger.filter", "--filter"},
	{"trigger.goal", "--goal"},
	{"trigger.inputs", "--inputs"},
	{"trigger.labels", "--label"},
	{"trigger.idempotency_key", "--idempotency-key"},
	{"trigger.webhook.enabled", "--webhook"},
	{"trigger.webhook.scheme", "--webhook-scheme"},
	{"trigger.webhook.secret_ref", "--webhook-secret-ref"},
	{"trigger.webhook.tolerance_seconds", "--webhook-tolerance-seconds"},
}

func triggerFlagError(msg string) error {
	for _, m := range triggerFlagOfField {
		msg = strings.ReplaceAll(msg, m.field+" ", m.flag+" ("+m.field+") ")
		msg = strings.ReplaceAll(msg, m.field+":", m.flag+" ("+m.field+"):")
		msg = strings.ReplaceAll(msg, m.field+"[", m.flag+" ("+m.field+")[")
	}
	return errors.New(msg)
}

// apply sets the fields of the flags given (changed: every flag for
// create) and validates the spec locally, naming the flag at fault.
func (f *triggerSpecFlags) apply(t *planexv1.Trigger, changed func(string) bool) error {
	set := func(flag string, dst *string, v string) {
		if changed(flag) {
			*dst = v
		}
	}
	set("description", &t.Description, f.description)
	set("subject", &t.Subject, f.subject)
	set("filter", &t.Filter, f.filter)
	set("goal", &t.Goal, f.goal)
	set("inputs", &t.Inputs, f.inputs)
	set("idempotency-key", &t.IdempotencyKey, f.key)
	if changed("label") {
		t.Labels = map[string]string{}
		for _, kv := range f.labels {
			k, expr, ok := strings.Cut(kv, "=")
			if !ok || k == "" || expr == "" {
				return fmt.Errorf("--label %q: want KEY=CEL expression, e.g. source='\"github\"'", kv)
			}
			t.Labels[k] = expr
		}
	}
	if changed("webhook") || changed("webhook-scheme") || changed("webhook-secret-ref") || changed("webhook-tolerance-seconds") {
		if t.Webhook == nil {
			t.Webhook = &planexv1.TriggerWebhook{}
		}
		w := t.Webhook
		if changed("webhook") {
			w.Enabled = f.webhook
		}
		if changed("webhook-scheme") || w.Scheme == "" {
			w.Scheme = f.scheme
		}
		set("webhook-secret-ref", &w.SecretRef, f.secretRef)
		if changed("webhook-tolerance-seconds") {
			w.ToleranceSeconds = f.tolerance
		}
		if !w.Enabled && w.SecretRef == "" {
			t.Webhook = nil
		}
	}
	if err := trigger.Validate(t); err != nil {
		return triggerFlagError(err.Error())
	}
	return nil
}

func triggersCreateCmd() *cobra.Command {
	var (
		of   outputFlags
		spec triggerSpecFlags
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a trigger",
		Example: `  planex triggers create gh-issues --subject planex.inbound.github.issues \
    --filter 'event.action == "opened"' --goal '"Triage issue: " + event.issue.title' \
    --inputs '{"issue": event.issue}' --idempotency-key 'headers["X-Github-Delivery"]' \
    --webhook --webhook-scheme github --webhook-secret-ref github`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t := &planexv1.Trigger{Name: args[0]}
			check := func() error { return spec.apply(t, func(string) bool { return true }) }
			return triggersCLI.run(cmd, &of, check, func(ctx context.Context, client planexv1.TriggerServiceClient, asJSON bool) error {
				resp, err := client.CreateTrigger(ctx, &planexv1.CreateTriggerRequest{Trigger: t})
				if err != nil {
					return err
				}
				return printTrigger(cmd.OutOrStdout(), resp.GetTrigger(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	spec.register(cmd.Flags())
	return cmd
}

func triggersUpdateCmd() *cobra.Command {
	var (
		of   outputFlags
		spec triggerSpecFlags
	)
	cmd := &cobra.Command{
		Use:   "update NAME",
		Short: "Change a trigger: only the flags given (read, modify, write with its revision)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return triggersCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.TriggerServiceClient, asJSON bool) error {
				got, err := client.GetTrigger(ctx, &planexv1.GetTriggerRequest{Name: args[0]})
				if err != nil {
					return err
				}
				t := got.GetTrigger()
				if err := spec.apply(t, cmd.Flags().Changed); err != nil {
					return err
				}
				resp, err := client.UpdateTrigger(ctx, &planexv1.UpdateTriggerRequest{Trigger: t})
				if err != nil {
					return err
				}
				return printTrigger(cmd.OutOrStdout(), resp.GetTrigger(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	spec.register(cmd.Flags())
	return cmd
}

func triggersListCmd() *cobra.Command {
	var of outputFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List triggers with their counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return triggersCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.TriggerServiceClient, asJSON bool) error {
				resp, err := client.ListTriggers(ctx, &planexv1.ListTriggersRequest{})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSUBJECT\tWEBHOOK\tPAUSED\tRECEIVED\tSTARTED\tDUPLICATES\tREJECTED\tFILTERED")
				for _, t := range resp.GetTriggers() {
					c := t.GetCounters()
					fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d\t%d\t%d\t%d\t%d\n", t.GetName(), t.GetSubject(), webhookSummary(t.GetWebhook()),
						t.GetPaused(), c.GetReceived(), c.GetStarted(), c.GetDuplicates(), c.GetRejected(), c.GetFiltered())
				}
				return tw.Flush()
			})
		},
	}
	of.register(cmd.Flags())
	return cmd
}

func triggersGetCmd() *cobra.Command {
	var of outputFlags
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a trigger with its counters",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return triggersCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.TriggerServiceClient, asJSON bool) error {
				resp, err := client.GetTrigger(ctx, &planexv1.GetTriggerRequest{Name: args[0]})
				if err != nil {
					return err
				}
				return printTrigger(cmd.OutOrStdout(), resp.GetTrigger(), asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	return cmd
}

// triggersNameCmd is pause, resume or delete.
func triggersNameCmd(verb, short string) *cobra.Command {
	var of outputFlags
	cmd := &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return triggersCLI.run(cmd, &of, nil, func(ctx context.Context, client planexv1.TriggerServiceClient, asJSON bool) error {
				var t *planexv1.Trigger
				switch verb {
				case "pause":
					resp, err := client.PauseTrigger(ctx, &planexv1.PauseTriggerRequest{Name: args[0]})
					if err != nil {
						return err
					}
					t = resp.GetTrigger()
				case "resume":
					resp, err := client.ResumeTrigger(ctx, &planexv1.ResumeTriggerRequest{Name: args[0]})
					if err != nil {
						return err
					}
					t = resp.GetTrigger()
				default:
					if _, err := client.DeleteTrigger(ctx, &planexv1.DeleteTriggerRequest{Name: args[0]}); err != nil {
						return err
					}
					if asJSON {
						return printJSON(cmd.OutOrStdout(), &planexv1.DeleteTriggerResponse{})
					}
					_, err := fmt.Fprintf(cmd.OutOrStdout(), "trigger %s deleted\n", args[0])
					return err
				}
				return printTrigger(cmd.OutOrStdout(), t, asJSON)
			})
		},
	}
	of.register(cmd.Flags())
	return cmd
}

func triggersRejectionsCmd() *cobra.Command {
	var (
		of    outputFlags
		limit int32
	)
	cmd := &cobra.Command{
		Use:   "rejections NAME",
		Short: "List the events a trigger rejected and why, newest first (payload digests, never payloads)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			check := func() error {
				if limit < 0 || limit > 1000 {
					return fmt.Errorf("--limit %d: want 0 (100) to 1000", limit)
				}
				return nil
			}
			return triggersCLI.run(cmd, &of, check, func(ctx context.Context, client planexv1.TriggerServiceClient, asJSON bool) error {
				resp, err := client.ListTriggerRejections(ctx, &planexv1.ListTriggerRejectionsRequest{Name: args[0], Limit: limit})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TIME\tEVENT\tSUBJECT\tREASON\tPAYLOAD SHA-256")
				for _, r := range resp.GetRejections() {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", r.GetTime().AsTime().Format("2006-01-02T15:04:05Z"), r.GetEventSequence(),
						r.GetSubject(), oneLineText(r.GetReason(), 80), r.GetPayloadSha256()[:min(16, len(r.GetPayloadSha256()))])
				}
				return tw.Flush()
			})
		},
	}
	of.register(cmd.Flags())
	cmd.Flags().Int32Var(&limit, "limit", 0, "at most this many rejections (0: 100; at most 1000)")
	return cmd
}

func triggersFireCmd() *cobra.Command {
	var (
		of       outputFlags
		data     string
		dataFile string
		subject  string
	)
	cmd := &cobra.Command{
		Use:     "fire NAME",
		Short:   "Publish a test event on a trigger's subject (evaluated like any other event)",
		Example: `  planex triggers fire orders --subject planex.inbound.orders.test --data '{"id":"o-1"}'`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var body []byte
			check := func() (err error) {
				body, err = eventBody(data, dataFile)
				if err == nil && !json.Valid(body) {
					// Sent anyway: testing a rejection is a use of fire.
					fmt.Fprintln(cmd.ErrOrStderr(), "warning: --data is not JSON; the trigger will reject the event")
				}
				return err
			}
			return triggersCLI.run(cmd, &of, check, func(ctx context.Context, client planexv1.TriggerServiceClient, asJSON bool) error {
				resp, err := client.FireTrigger(ctx, &planexv1.FireTriggerRequest{Name: args[0], Data: body, Subject: subject})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "event %d published on %s; `planex triggers get %s` counts it once evaluated\n", resp.GetEventSequence(), resp.GetSubject(), args[0])
				return err
			})
		},
	}
	of.register(cmd.Flags())
	cmd.Flags().StringVar(&data, "data", "", "the event's JSON body")
	cmd.Flags().StringVar(&dataFile, "data-file", "", "file holding the event's JSON body")
	cmd.Flags().StringVar(&subject, "subject", "", "subject to publish on (required when the trigger's subject has wildcards)")
	return cmd
}

// eventBody is the body of `triggers fire`: --data or the content of
// --data-file (exactly one of them).
func eventBody(data, dataFile string) ([]byte, error) {
	switch {
	case data != "" && dataFile != "":
		return nil, errors.New("--data and --data-file: give one")
	case dataFile != "":
		body, err := os.ReadFile(dataFile)
		if err != nil {
			return nil, fmt.Errorf("--data-file: %w", err)
		}
		return body, nil
	case data == "":
		return nil, errors.New("--data: required (the event's JSON body), or --data-file")
	}
	return []byte(data), nil
}

func webhookSummary(w *planexv1.TriggerWebhook) string {
	if !w.GetEnabled() {
		return "-"
	}
	return w.GetScheme()
}

func printTrigger(w io.Writer, t *planexv1.Trigger, asJSON bool) error {
	if asJSON {
		return printJSON(w, t)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", t.GetName())
	if t.GetDescription() != "" {
		fmt.Fprintf(tw, "description:\t%s\n", t.GetDescription())
	}
	fmt.Fprintf(tw, "subject:\t%s\n", t.GetSubject())
	if wh := t.GetWebhook(); wh.GetEnabled() {
		fmt.Fprintf(tw, "webhook:\t%s, secret %s (POST /v1/hooks/<tenant>/%s)\n", wh.GetScheme(), wh.GetSecretRef(), t.GetName())
	}
	fmt.Fprintf(tw, "filter:\t%s\n", orDash(t.GetFilter()))
	fmt.Fprintf(tw, "goal:\t%s\n", t.GetGoal())
	fmt.Fprintf(tw, "inputs:\t%s\n", orDash(t.GetInputs()))
	for k, v := range t.GetLabels() {
		fmt.Fprintf(tw, "label %s:\t%s\n", k, v)
	}
	fmt.Fprintf(tw, "idempotency key:\t%s\n", t.GetIdempotencyKey())
	fmt.Fprintf(tw, "paused:\t%v\n", t.GetPaused())
	c := t.GetCounters()
	fmt.Fprintf(tw, "events:\t%d received, %d started, %d duplicates, %d rejected, %d filtered\n",
		c.GetReceived(), c.GetStarted(), c.GetDuplicates(), c.GetRejected(), c.GetFiltered())
	fmt.Fprintf(tw, "revision:\t%d\n", t.GetRevision())
	return tw.Flush()
}

// triggerRPCError explains a TriggerService refusal, naming the flag of
// a spec error: nil for nil, an error that is not a gRPC status
// unchanged.
func triggerRPCError(addr string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.PermissionDenied:
		return fmt.Errorf("permission denied by the supervisor at %s (managing triggers needs the operator role): %s", addr, st.Message())
	case codes.InvalidArgument:
		return triggerFlagError(st.Message())
	case codes.NotFound, codes.AlreadyExists, codes.Aborted, codes.FailedPrecondition:
		return errors.New(st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("the supervisor at %s does not serve triggers (an earlier release)", addr)
	}
	return rpcError(addr, err)
}
