package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/planner"
)

// devCassette are `planex dev`'s --record and --replay: the dev stack's
// planner answers and tool results go into a cassette, or come from one
// (what `planex eval --dev` does for a suite, for any client of the dev
// stack).
type devCassette struct {
	record, replay, replayMiss string
}

func (c *devCassette) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.record, "record", "", "record every planner answer, tool result and model critic verdict, and the tool catalog, into this cassette directory (for planex eval --replay, planex planner/executor --replay)")
	fs.StringVar(&c.replay, "replay", "", "answer planner requests, tool calls and critic requests from this cassette directory")
	fs.StringVar(&c.replayMiss, "replay-miss", planner.ReplayMissError, "with --replay, a request the cassette lacks: error (fail naming it) or live (ask the dev stack's planner or tool)")
}

// wire opens the cassette and layers it on the dev stack's tools and
// planner; nil when neither flag is set.
func (c *devCassette) wire(f *devFlags) (*cassette.Cassette, error) {
	if f.services.Planner.Backend == planner.BackendReplay {
		f.services.Planner.Replay = c.replay // --planner-backend replay answers from --replay
	}
	switch {
	case c.record != "" && c.replay != "":
		return nil, errors.New("--record and --replay: choose one")
	case c.replayMiss != planner.ReplayMissError && c.replayMiss != planner.ReplayMissLive:
		return nil, fmt.Errorf("--replay-miss %q: want error or live", c.replayMiss)
	case c.record == "" && c.replay == "":
		return nil, nil
	}
	cas, err := cassette.Open(cmp(c.record, c.replay), nil)
	if err != nil {
		return nil, err
	}
	record, liveMiss := c.record != "", c.replayMiss == planner.ReplayMissLive
	f.services.WrapTool = func(t runner.Tool) runner.Tool { return cassetteTool(t, cas, record, liveMiss) }
	f.services.Planner.Wrap = func(b planner.Backend) planner.Backend { return cassettePlanner(b, cas, record, liveMiss) }
	return cas, nil
}

// started saves the running stack's tool catalog into a recording and
// says where the cassette is.
func (c *devCassette) started(ctx context.Context, stack *devstack.Stack, cas *cassette.Cassette, out io.Writer) error {
	if cas == nil {
		return nil
	}
	if c.replay != "" {
		fmt.Fprintf(out, "  replay      %s   (%d recorded interactions; misses: %s)\n", cas.Dir(), cas.Len(), c.replayMiss)
		return nil
	}
	sf := storeFlags{url: stack.NATSURL}
	sf.auth.NKeySeedFile = stack.Credentials.NATSSeedFiles["supervisor"]
	js, closeJS, err := sf.connect(ctx)
	if err != nil {
		return err
	}
	defer closeJS()
	if err := writeCatalog(ctx, js, cas); err != nil {
		return err
	}
	fmt.Fprintf(out, "  record      %s   (planner answers, tool results and %s)\n", cas.Dir(), cassette.CatalogFile)
	return nil
}
