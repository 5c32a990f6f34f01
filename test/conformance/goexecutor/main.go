// Command goexecutor is the Go runner (services/executor/runner) serving
// the conformance pool "conf" under the contract of
// test/conformance/README.md: configured by the CONFORMANCE_* environment,
// it verifies step signatures with the trusted keys, records every
// execution in the record file, and shuts down gracefully on SIGTERM.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/test/conformance"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "goexecutor:", err)
		os.Exit(1)
	}
}

func run() (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	env := func(name string) (string, error) {
		v := os.Getenv(name)
		if v == "" {
			return "", fmt.Errorf("%s: required", name)
		}
		return v, nil
	}
	ms := func(name string) (time.Duration, error) {
		v, err := env(name)
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%s %q: want a positive number of milliseconds", name, v)
		}
		return time.Duration(n) * time.Millisecond, nil
	}
	url, err := env(conformance.EnvNATSURL)
	if err != nil {
		return err
	}
	pool, err := env(conformance.EnvPool)
	if err != nil {
		return err
	}
	if pool != conformance.Pool {
		return fmt.Errorf("%s %q: this executor serves pool %q", conformance.EnvPool, pool, conformance.Pool)
	}
	keys, err := env(conformance.EnvVerifyKeys)
	if err != nil {
		return err
	}
	recordFile, err := env(conformance.EnvRecordFile)
	if err != nil {
		return err
	}
	ackWait, err := ms(conformance.EnvAckWaitMS)
	if err != nil {
		return err
	}
	grace, err := ms(conformance.EnvGraceMS)
	if err != nil {
		return err
	}
	maxDeliver := runner.DefaultMaxDeliver
	if v := os.Getenv(conformance.EnvMaxDeliver); v != "" {
		if maxDeliver, err = strconv.Atoi(v); err != nil || maxDeliver < 1 {
			return fmt.Errorf("%s %q: want a positive integer", conformance.EnvMaxDeliver, v)
		}
	}

	verifier, err := stepsign.NewVerifier(stepsign.VerifierOptions{KeysPath: keys, Logger: logger})
	if err != nil {
		return err
	}
	rec, err := os.OpenFile(recordFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("%s: %w", conformance.EnvRecordFile, err)
	}
	defer func() { err = errors.Join(err, rec.Close()) }()

	nc, err := nats.Connect(url, nats.Name("planex-conformance-goexecutor"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	defer func() {
		if derr := nc.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
			err = errors.Join(err, fmt.Errorf("drain NATS connection: %w", derr))
		}
	}()
	res, err := bus.Setup(ctx, nc, bus.Options{})
	if err != nil {
		return err
	}
	shared, err := stepsign.OpenSharedReplays(ctx, res.JS, pool, 1)
	if err != nil {
		return err
	}
	verifier.ShareReplays(shared)

	replica := runner.NewReplicaID()
	tools, err := newTools(&recorder{f: rec, replica: replica})
	if err != nil {
		return err
	}
	r, err := runner.New(res, runner.Options{
		Pool: pool, Tools: tools, ReplicaID: replica, AckWait: ackWait, MaxDeliver: maxDeliver,
		Verifier: verifier, Logger: logger,
	})
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	logger.Info("conformance executor serving", "pool", pool, "executor_id", replica)
	<-ctx.Done()
	logger.Info("shutting down", "grace", grace)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	return r.Stop(sctx)
}

// recorder appends one JSON line per execution to the record file.
type recorder struct {
	mu      sync.Mutex
	f       *os.File
	replica string
}

// record writes the line of an execution (one write) and returns its id.
func (r *recorder) record(tool string, c runner.Call) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b[:])
	line, err := json.Marshal(conformance.Record{Tool: tool, RunID: c.RunID, StepID: c.StepID, Attempt: c.Attempt, ExecutorID: r.replica, ExecutionID: id})
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(line, '\n')); err != nil {
		return "", fmt.Errorf("record execution: %w", err)
	}
	return id, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func newTools(rec *recorder) ([]runner.Tool, error) {
	specs, err := conformance.Specs()
	if err != nil {
		return nil, err
	}
	run := map[string]func(ctx context.Context, c runner.Call) (any, error){
		conformance.ToolEcho: func(_ context.Context, c runner.Call) (any, error) {
			if _, err := rec.record(conformance.ToolEcho, c); err != nil {
				return nil, err
			}
			return map[string]any{"text": c.Args.GetFields()["text"].GetStringValue()}, nil
		},
		conformance.ToolWrite: func(ctx context.Context, c runner.Call) (any, error) {
			id, err := rec.record(conformance.ToolWrite, c)
			if err != nil {
				return nil, err
			}
			d, terr := runner.IntArg(c.Args, "sleep_ms", 0, 0, 60000)
			if terr != nil {
				return nil, terr
			}
			if err := sleep(ctx, time.Duration(d)*time.Millisecond); err != nil {
				return nil, err
			}
			f := c.Args.GetFields()
			return map[string]any{"key": f["key"].GetStringValue(), "value": f["value"].GetStringValue(), "execution_id": id}, nil
		},
		conformance.ToolSlow: func(ctx context.Context, c runner.Call) (any, error) {
			if _, err := rec.record(conformance.ToolSlow, c); err != nil {
				return nil, err
			}
			d, terr := runner.IntArg(c.Args, "ms", 1, 1, 60000)
			if terr != nil {
				return nil, terr
			}
			if err := sleep(ctx, time.Duration(d)*time.Millisecond); err != nil {
				return nil, err
			}
			return map[string]any{"slept_ms": d}, nil
		},
	}
	tools := make([]runner.Tool, 0, len(specs))
	for _, s := range specs {
		tools = append(tools, runner.NewTool(s, run[s.GetName()]))
	}
	return tools, nil
}
