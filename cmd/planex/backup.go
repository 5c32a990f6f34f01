package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/planex-dev/planex/internal/backup"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// backupCmd is `planex backup`: snapshots of planex's JetStream state into
// a directory, and `planex backup verify` to check one offline.
func backupCmd() *cobra.Command {
	var (
		sf      storeFlags
		out     string
		check   bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "backup --out DIR",
		Short: "Back up planex's state in NATS JetStream (run logs, queues, snapshots, effects, outputs) into a new directory",
		Long: "Snapshot every planex stream and bucket that holds state — run logs, engine inbox, step queues, idempotency keys, run snapshots,\n" +
			"stored outputs, tool floors, step replay cache, email drafts and side-effect records, each with its consumers — into DIR\n" +
			"(new or empty), one directory per stream as `nats stream backup` writes it, then a manifest (backup.json) with the\n" +
			"streams' configuration, message counts, last sequences and file checksums. The tool catalog, supervisor registrations and\n" +
			"plan cache are left out: the services rebuild them. A backup may be taken while planex runs (see docs/backup.md).\n" +
			"Any stream that fails fails the backup, naming it; the directory then has no manifest. Needs a NATS user that may\n" +
			"snapshot streams (an account admin, not a service's confined identity).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("--out: give the directory to write the backup to (new or empty)")
			}
			js, closeConn, err := sf.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer closeConn()
			w := cmd.OutOrStdout()
			m, err := backup.Backup(cmd.Context(), js.Conn(), backup.Options{
				Dir: out, PlanexVersion: readBuildInfo().Version, Check: check, Timeout: timeout,
				OnStream: func(s backup.StreamBackup) {
					fmt.Fprintf(w, "%-28s %8d messages  last sequence %-8d %d consumers  %s\n", s.Name, s.Messages, s.LastSeq, s.Consumers, humanBytes(s.Bytes))
				},
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "backed up %d streams into %s in %s; check it with `planex backup verify %s`\n", len(m.Streams), out, m.Finished.Sub(m.Started).Round(time.Millisecond), out)
			return nil
		},
	}
	sf.register(cmd.Flags())
	cmd.Flags().StringVar(&out, "out", "", "directory to write the backup to; must not exist or be empty")
	cmd.Flags().BoolVar(&check, "check", true, "have the server check each stream's stored messages before its snapshot (nats stream backup --check)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "timeout of each JetStream API request (the transfer itself is not bounded)")
	cmd.AddCommand(backupVerifyCmd())
	return cmd
}

// backupVerifyCmd is `planex backup verify DIR`: the manifest and every
// file's checksum, without NATS.
func backupVerifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify DIR",
		Short: "Check a backup offline: its manifest, and each file's size and SHA-256",
		Long: "Check a backup directory without connecting to NATS: the manifest reads, and every file it lists is there with its size and SHA-256.\n" +
			"Exits 3 naming the first file at fault. `planex restore` runs the same check before it writes anything.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := backup.Verify(args[0])
			if err != nil {
				return &exitError{code: exitFailed, msg: "backup verify: " + err.Error()}
			}
			w := cmd.OutOrStdout()
			printManifest(w, m)
			fmt.Fprintf(w, "backup %s verified: %d streams, every file matches its checksum\n", args[0], len(m.Streams))
			return nil
		},
	}
}

func printManifest(w io.Writer, m *backup.Manifest) {
	fmt.Fprintf(w, "taken %s by planex %s from NATS %s\n", m.Started.Format(time.RFC3339), m.PlanexVersion, m.ServerVersion)
	for _, s := range m.Streams {
		fmt.Fprintf(w, "%-28s %8d messages  last sequence %-8d %d consumers  R%d\n", s.Name, s.Messages, s.LastSeq, s.Consumers, s.Replicas)
	}
}

// restoreCmd is `planex restore`: a backup into a NATS without planex's
// streams, then a check of every restored run.
func restoreCmd() *cobra.Command {
	var (
		sf       storeFlags
		in       string
		replicas int
		replace  bool
		dryRun   bool
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "restore --in DIR",
		Short: "Restore a planex backup into NATS JetStream, then verify every restored run log",
		Long: "Verify the backup in DIR (manifest and checksums, naming a file at fault), refuse if any of its streams exists on the target\n" +
			"(naming them; --replace deletes and restores them), restore every stream with its consumers, with --replicas replicas\n" +
			"(default: each stream's count in the backup), and then check every restored run: its log verifies (as `planex audit\n" +
			"verify`) and its snapshot agrees with the log (one that does not is rewritten from the log). Start the planex services\n" +
			"after the restore: runs waiting at gates wait on, steps queued at the backup are delivered again, and side effects\n" +
			"recorded as done are not repeated. --dry-run checks the backup and the target without writing. Exits 3 when a restored\n" +
			"run log does not verify.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if in == "" {
				return errors.New("--in: give the backup directory to restore")
			}
			if replicas < 0 || replicas > 5 {
				return fmt.Errorf("--replicas %d: want 1 to 5 (3 in a 3-node cluster), or 0 for each stream's count in the backup", replicas)
			}
			ctx := cmd.Context()
			if _, err := backup.Verify(in); err != nil {
				return &exitError{code: exitFailed, msg: "restore: " + err.Error()}
			}
			js, closeConn, err := sf.connect(ctx)
			if err != nil {
				return err
			}
			defer closeConn()
			w := cmd.OutOrStdout()
			verb := "restored"
			if dryRun {
				verb = "would restore"
			}
			res, err := backup.Restore(ctx, js.Conn(), backup.RestoreOptions{
				Dir: in, Replicas: replicas, Replace: replace, DryRun: dryRun, Timeout: timeout,
				OnStream: func(s backup.RestoredStream) {
					note := ""
					if s.Replaced {
						note = "  (replaced the existing stream)"
					}
					if s.Expired > 0 {
						note += fmt.Sprintf("  (%d messages past the stream's max age expired)", s.Expired)
					}
					fmt.Fprintf(w, "%s %-28s %8d messages  last sequence %-8d %d consumers  R%d%s\n", verb, s.Name, s.Messages, s.LastSeq, s.Consumers, s.Replicas, note)
				},
			})
			if err != nil {
				return err
			}
			if dryRun {
				fmt.Fprintf(w, "dry run: the backup verifies and %d streams would be restored; nothing was written\n", len(res.Streams))
				return nil
			}
			check, err := checkRestoredRuns(ctx, js)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "restored %d streams from %s (taken %s); %d runs: %d logs verified, %d snapshots rewritten from their log\n",
				len(res.Streams), in, res.Manifest.Started.Format(time.RFC3339), check.runs, check.verified, check.repaired)
			if len(check.broken) > 0 {
				return &exitError{code: exitFailed, msg: "restore: run logs that do not verify (as in the backup; inspect them with `planex audit verify RUN_ID`):\n  " + strings.Join(check.broken, "\n  ")}
			}
			fmt.Fprintln(w, "start the planex services against this NATS: waiting runs continue from where the backup left them")
			return nil
		},
	}
	sf.register(cmd.Flags())
	cmd.Flags().StringVar(&in, "in", "", "backup directory written by planex backup")
	cmd.Flags().IntVar(&replicas, "replicas", 0, "replicas of every restored stream (3 in a 3-node cluster, 1 on a single server); 0: each stream's count in the backup")
	cmd.Flags().BoolVar(&replace, "replace", false, "delete the target's streams that the backup holds and restore them (stop the planex services first); without it their presence fails the restore")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "verify the backup and check the target (what exists, what would be replaced) without writing anything")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "timeout of each JetStream API request (the transfer itself is not bounded)")
	return cmd
}

// restoredRuns is what checkRestoredRuns found.
type restoredRuns struct {
	runs, verified, repaired int
	broken                   []string // "<run>: <first broken entry>"
}

// checkRestoredRuns verifies the log of every run in PLANEX_EVENTS (the
// audit verify code path) and loads each with the supervisor's run log,
// which rewrites a snapshot that disagrees with the log: the streams were
// snapshotted one after another, so planex-runs may hold a run's snapshot
// from after the log's snapshot (or none), which ListRuns would show as
// it is until a supervisor next loads the run.
func checkRestoredRuns(ctx context.Context, js jetstream.JetStream) (*restoredRuns, error) {
	ids, err := runIDs(ctx, js)
	if err != nil {
		return nil, err
	}
	runs, err := js.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", bus.BucketRuns, err)
	}
	logs, err := runlog.New(ctx, &bus.Resources{JS: js, Runs: runs}, slog.New(slog.DiscardHandler), runlog.Options{CacheSize: 1})
	if err != nil {
		return nil, err
	}
	out := &restoredRuns{runs: len(ids)}
	for _, id := range ids {
		if _, err := runlog.VerifyStored(ctx, js, id); err != nil {
			var be *runlog.BrokenEventError
			if !errors.As(err, &be) {
				return nil, fmt.Errorf("verify run %s: %w", id, err)
			}
			out.broken = append(out.broken, be.Error())
			continue
		}
		out.verified++
		before := revision(ctx, runs, id)
		if _, err := logs.Load(ctx, id); err != nil {
			return nil, fmt.Errorf("load run %s: %w", id, err)
		}
		if revision(ctx, runs, id) != before {
			out.repaired++
		}
	}
	return out, nil
}

// revision is the planex-runs revision of a run's snapshot (0: none).
func revision(ctx context.Context, kv jetstream.KeyValue, id string) uint64 {
	e, err := kv.Get(ctx, id)
	if err != nil {
		return 0
	}
	return e.Revision()
}

// runIDs lists the runs whose logs PLANEX_EVENTS holds, in either layout.
func runIDs(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	str, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", bus.StreamEvents, err)
	}
	info, err := str.Info(ctx, jetstream.WithSubjectFilter(bus.SubjectEventsPrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("list the subjects of %s: %w", bus.StreamEvents, err)
	}
	seen := map[string]bool{}
	for subject := range info.State.Subjects {
		if id, ok := bus.RunOfLogSubject(subject); ok && bus.ValidRunID(id) {
			seen[id] = true
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// humanBytes writes a byte count for people.
func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
