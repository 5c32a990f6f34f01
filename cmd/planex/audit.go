package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// storeFlags reach the stored run log directly on NATS: the audit commands
// check what is stored, which the API (redacting, and refusing a log that
// does not verify) cannot show. Reading PLANEX_EVENTS is an operator's
// right (the supervisor's NATS identity, or an operator user).
type storeFlags struct {
	url      string
	identity string
	auth     natsauth.Options
	dev      devStore // a planex dev on this machine, found by --addr
}

func (f *storeFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.url, "nats-url", "nats://127.0.0.1:4222", "NATS server holding the run logs (PLANEX_EVENTS)")
	fs.StringVar(&f.identity, "nats-identity", "supervisor", "NATS identity of the credentials: replies arrive on its inboxes (_INBOX_<identity>), the only ones per-service permissions let it read")
	f.auth.RegisterFlags(fs)
	f.dev.register(fs)
}

// connect returns JetStream on the configured server and a closer.
func (f *storeFlags) connect(ctx context.Context) (jetstream.JetStream, func(), error) {
	hint := f.dev.apply(f)
	if err := f.auth.Validate(f.url); err != nil {
		return nil, nil, err
	}
	opts, err := f.auth.NATSOptions()
	if err != nil {
		return nil, nil, err
	}
	identity := f.identity
	if identity == "" {
		identity = "supervisor"
	}
	nc, err := bus.Connect(ctx, f.url, "planex-"+identity, slog.New(slog.DiscardHandler), opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w%s", f.url, err, hint)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, nc.Close, nil
}

// runsExportCmd writes a run log as JSON lines for archival.
func runsExportCmd() *cobra.Command {
	var (
		sf       storeFlags
		out      string
		noRedact bool
	)
	cmd := &cobra.Command{
		Use:   "export RUN_ID",
		Short: "Write a run's log as JSON lines (sensitive tool fields redacted) for archival",
		Long: "Write a run's stored log as JSON lines: one object per event with run_id, sequence, redacted, commitment and the event (protojson, with its hash and prev_hash).\n" +
			"Arguments and outputs of tools that declare sensitive fields, and credentials anywhere, are masked: the event is marked redacted and carries a commitment\n" +
			"(salts of what it shows, keyed digests of what it masks) from which `planex audit verify FILE` recomputes its hash, so every field shown is verified.\n" +
			"Reads PLANEX_EVENTS directly: give an identity allowed to read it (the supervisor's).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			js, closeConn, err := sf.connect(ctx)
			if err != nil {
				return err
			}
			defer closeConn()
			events, err := runlog.ReadStored(ctx, js, args[0])
			if err != nil {
				return err
			}
			var exported []runlog.ExportedEvent
			if noRedact {
				for _, ev := range events {
					exported = append(exported, runlog.ExportedEvent{Event: ev})
				}
			} else {
				mask, err := loadMask(ctx, js)
				if err != nil {
					return err
				}
				exported = mask.Export(events)
			}
			w := cmd.OutOrStdout()
			if out != "" && out != "-" {
				f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
				if err != nil {
					return fmt.Errorf("-o: %w", err)
				}
				defer f.Close()
				w = f
			}
			if err := runlog.WriteExport(w, exported); err != nil {
				return fmt.Errorf("export run %s: %w", args[0], err)
			}
			if f, ok := w.(*os.File); ok && w != cmd.OutOrStdout() {
				if err := f.Close(); err != nil {
					return fmt.Errorf("-o: %w", err)
				}
			}
			return nil
		},
	}
	sf.register(cmd.Flags())
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write (default: stdout)")
	cmd.Flags().BoolVar(&noRedact, "no-redact", false, "write the events as stored (for planex replay and a full audit verify); keep the file as safe as the event stream")
	return cmd
}

func auditCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Check run logs: sequence and hash chain",
	}
	cmd.AddCommand(auditVerifyCmd())
	return cmd
}

func auditVerifyCmd() *cobra.Command {
	var sf storeFlags
	cmd := &cobra.Command{
		Use:   "verify RUN_ID|FILE",
		Short: "Verify a run log's sequence and hash chain; name the first broken entry",
		Long: "Verify a stored run log (RUN_ID, read from PLANEX_EVENTS) or an export (FILE from `planex runs export`): events 1, 2, 3… in order,\n" +
			"each prev_hash the hash of the event before, each hash matching its content, and the events folding into a run.\n" +
			"A redacted event's hash is recomputed from what the export shows and its commitment; one redacted without a commitment\n" +
			"(an export by an older planex, or an event appended before per-field hashes) cannot be checked: the log is then only\n" +
			"partially verified, and the command names those events and exits 3.\n" +
			"A stored entry that is not a planex event at all is named too. Exits 3 naming the first broken entry: the run, the event,\n" +
			"the stream sequence of a stored one (what the supervisor's DataLoss answer for a corrupt run names) and what is wrong.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := verifyLog(cmd.Context(), &sf, args[0])
			var (
				be  *runlog.BrokenEventError
				bad *badExportError
			)
			switch {
			case errors.As(err, &be):
				return &exitError{code: exitFailed, msg: "audit: " + be.Error()}
			case errors.As(err, &bad):
				return &exitError{code: exitFailed, msg: "audit: " + bad.Error()}
			case err != nil:
				return err
			}
			printVerified(cmd.OutOrStdout(), v)
			if v.Partial() {
				return &exitError{code: exitFailed, msg: fmt.Sprintf("audit: run %s: partially verified: the content of events %s was redacted without a commitment (an export by an older planex, or events appended before per-field hashes): their links are checked, their content is not; verify RUN_ID against the stored log", v.RunID, seqList(v.Unchecked))}
			}
			return nil
		},
	}
	sf.register(cmd.Flags())
	return cmd
}

// verifyLog verifies an export file (an existing path) or a stored run
// log (a run id), whose broken entries are named with their stream
// sequence.
func verifyLog(ctx context.Context, sf *storeFlags, arg string) (*runlog.Verified, error) {
	if _, err := os.Stat(arg); err == nil || !bus.ValidToken(arg) {
		f, err := os.Open(arg)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a readable export file nor a run id: %w", arg, err)
		}
		defer f.Close()
		exported, err := runlog.ReadExport(f)
		if err != nil {
			return nil, &badExportError{file: arg, err: err}
		}
		return runlog.VerifyExport(exported)
	}
	js, closeConn, err := sf.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	return runlog.VerifyStored(ctx, js, arg)
}

// badExportError is an export file that does not read as one: it fails
// verification like a broken chain does.
type badExportError struct {
	file string
	err  error
}

func (e *badExportError) Error() string { return e.file + ": " + e.err.Error() }

func (e *badExportError) Unwrap() error { return e.err }

func printVerified(w io.Writer, v *runlog.Verified) {
	state := "unfinished"
	if v.Finished {
		state = "finished"
	}
	verified := "verified"
	if v.Partial() {
		verified = "partially verified"
	}
	fmt.Fprintf(w, "run %s: %d events %s (%s), last hash %s\n", v.RunID, v.Events, verified, state, hex.EncodeToString(v.LastHash))
	if n := len(v.Masked); n > 0 {
		seqs := make([]uint64, n)
		values := 0
		for i, m := range v.Masked {
			seqs[i] = m.Sequence
			values += len(m.Paths)
		}
		fmt.Fprintf(w, "%d redacted events (%s): every field shown verified; %d masked values committed to, not shown (their shown text, a redaction mark, is not evidence)\n", n, seqList(seqs), values)
	}
	if n := len(v.Unchecked); n > 0 {
		fmt.Fprintf(w, "%d redacted events without a commitment (%s): links checked, content NOT checked\n", n, seqList(v.Unchecked))
	}
}

// seqList writes event sequences for people: "3, 5, 9" (the first 20,
// then how many more).
func seqList(seqs []uint64) string {
	const shown = 20
	parts := make([]string, 0, min(len(seqs), shown))
	for i, s := range seqs {
		if i == shown {
			return strings.Join(parts, ", ") + fmt.Sprintf(" and %d more", len(seqs)-shown)
		}
		parts = append(parts, strconv.FormatUint(s, 10))
	}
	return strings.Join(parts, ", ")
}

// loadEvents reads a run log from an export file (an existing path) or
// from the store (a run id), with which events an export redacted.
func loadEvents(ctx context.Context, sf *storeFlags, arg string) ([]*planexv1.RunEvent, []bool, error) {
	if f, err := os.Open(arg); err == nil {
		defer f.Close()
		exported, err := runlog.ReadExport(f)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", arg, err)
		}
		events, redacted := make([]*planexv1.RunEvent, len(exported)), make([]bool, len(exported))
		for i, e := range exported {
			events[i], redacted[i] = e.Event, e.Redacted
		}
		return events, redacted, nil
	} else if !errors.Is(err, os.ErrNotExist) || !bus.ValidToken(arg) {
		return nil, nil, fmt.Errorf("%q is neither a readable export file nor a run id: %w", arg, err)
	}
	js, closeConn, err := sf.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer closeConn()
	events, err := runlog.ReadStored(ctx, js, arg)
	return events, nil, err
}

// loadMask reads the tool catalog for the export's mask: the tools'
// sensitive fields, and credentials by pattern. An unreadable catalog
// fails the export (closed: nothing is written unredacted).
func loadMask(ctx context.Context, js jetstream.JetStream) (*runlog.Mask, error) {
	kv, err := js.KeyValue(ctx, bus.BucketTools)
	if err != nil {
		return nil, fmt.Errorf("read tool catalog for redaction (%s): %w", bus.BucketTools, err)
	}
	cat, err := catalog.Load(ctx, kv, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("read tool catalog for redaction: %w", err)
	}
	return runlog.NewMask(cat.Specs(), redact.New(redact.SecretPatterns()...)), nil
}
