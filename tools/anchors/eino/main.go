package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

// flagError is a bad command line (exit status 2).
type flagError struct {
	err error
	// printed: the flag package has already printed it, with the usage.
	printed bool
}

func (e *flagError) Error() string { return e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var fe *flagError
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, &fe):
		if !fe.printed {
			fmt.Fprintln(os.Stderr, "eino anchor:", err)
		}
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "eino anchor:", err)
		os.Exit(1)
	}
}

// run parses args, measures and writes the result to stdout, progress to
// stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, asJSON, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	res, err := measure(ctx, cfg, stderr)
	if err != nil {
		return fmt.Errorf("measure: %w", err)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
		return nil
	}
	if err := res.WriteText(stdout); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// parseFlags reads the command line; usage and flag errors go to output.
func parseFlags(args []string, output io.Writer) (Config, bool, error) {
	fs := flag.NewFlagSet("eino", flag.ContinueOnError)
	fs.SetOutput(output)
	chains := fs.String("chains", "10,100,1000", "comma-separated plan lengths, in steps")
	reps := fs.Int("reps", 5, "repetitions per plan length")
	stepsPerRep := fs.Int("steps-per-rep", 200, "steps per repetition: a repetition is the mean of ceil(steps-per-rep/N) runs")
	warmup := fs.Int("warmup-steps", 50, "warm-up runs of at least this many steps in all before each plan length")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	fs.Usage = func() {
		fmt.Fprintln(output, "usage: go run . [--chains 10,100,1000] [--reps 5] [--steps-per-rep 200] [--warmup-steps 50] [--json]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, false, err
		}
		return Config{}, false, &flagError{err: err, printed: true}
	}
	if fs.NArg() > 0 {
		return Config{}, false, &flagError{err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	cfg := Config{Reps: *reps, StepsPerRep: *stepsPerRep, WarmupSteps: *warmup}
	var errs []error
	lengths, err := parseChains(*chains)
	if err != nil {
		errs = append(errs, err)
	}
	cfg.Chains = lengths
	if cfg.Reps < 1 {
		errs = append(errs, fmt.Errorf("--reps %d: must be positive", cfg.Reps))
	}
	if cfg.StepsPerRep < 1 {
		errs = append(errs, fmt.Errorf("--steps-per-rep %d: must be positive", cfg.StepsPerRep))
	}
	if cfg.WarmupSteps < 0 {
		errs = append(errs, fmt.Errorf("--warmup-steps %d: must not be negative", cfg.WarmupSteps))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, false, &flagError{err: err}
	}
	return cfg, *asJSON, nil
}

// parseChains reads a comma-separated list of positive plan lengths.
func parseChains(s string) ([]int, error) {
	var lengths []int
	for part := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--chains %q: %q is not a positive number of steps", s, part)
		}
		lengths = append(lengths, n)
	}
	return lengths, nil
}
