package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteText prints the result as a table for people.
func (r *Result) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, s Stat, unit, extra string) {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%s\t%s\t\n", name, s.Min, s.Median, s.Max, unit, extra)
	}
	fmt.Fprintf(tw, "figure (NATS: %s)\tmin\tmedian\tmax\tunit\t\t\n", r.NATS)
	row("JetStream two-hop floor", r.FloorMs, "ms", "")
	for _, c := range r.Chains {
		row(fmt.Sprintf("chain %d: floor alongside", c.Steps), c.FloorMs, "ms", "")
		row(fmt.Sprintf("chain %d: per step", c.Steps), c.PerStepMs, "ms", fmt.Sprintf("planex/floor %.2f", c.FloorRatio))
		row(fmt.Sprintf("chain %d: per step, watched", c.Steps), c.WatchedPerStepMs, "ms", fmt.Sprintf("planex/floor %.2f", c.WatchedFloorRatio))
		row(fmt.Sprintf("chain %d: per step e2e", c.Steps), c.E2EPerStepMs, "ms", "")
	}
	if len(r.Chains) > 1 && r.Chains[0].PerStepMs.Median > 0 {
		first, last := r.Chains[0], r.Chains[len(r.Chains)-1]
		fmt.Fprintf(tw, "chain %d / chain %d per step\t\t%.2f\t\t×\t\t\n", last.Steps, first.Steps, last.PerStepMs.Median/first.PerStepMs.Median)
	}
	if f := r.FirstStep; f != nil {
		fmt.Fprintf(tw, "StartRun → first step dispatched\t\t%.3f\t\tms p50\tp90 %.3f, p99 %.3f, max %.3f (%d runs)\t\n", f.P50, f.P90, f.P99, f.Max, f.N)
	}
	if t := r.Throughput; t != nil {
		row(fmt.Sprintf("throughput: %d runs × %d steps", t.Runs, t.StepsPerRun), t.StepsPerSec, "steps/s", "")
	}
	if wr := r.Waiting; wr != nil {
		fmt.Fprintf(tw, "waiting: %d runs at a gate\t\t%.1f\t\tMiB RSS\t(before: %.1f MiB; Go heap %.1f MiB; %d goroutines)\t\n", wr.Runs, wr.RSSMiB, wr.BaselineRSSMiB, wr.HeapMiB, wr.Goroutines)
		fmt.Fprintf(tw, "waiting: CPU\t\t%.2f\t\t%%\t\t\n", wr.CPUPercent)
		row("waiting: ListRuns first page", wr.ListRunsMs, "ms", "")
		if wr.FirstIndexedSeconds > 0 {
			fmt.Fprintf(tw, "waiting: runs parked earlier, indexed\t\t%.2f\t\ts\t(%d from the checkpoint)\t\n", wr.FirstIndexedSeconds, wr.FirstFromCheckpoint)
		} else {
			fmt.Fprintf(tw, "waiting: start + park\t\t%.1f\t\ts\t\t\n", wr.StartSeconds)
		}
		fmt.Fprintf(tw, "waiting: supervisor stop\t\t%.2f\t\ts\t(engine drained, run index checkpoint written)\t\n", wr.StopSeconds)
		fmt.Fprintf(tw, "waiting: supervisor restart\t\t%.2f\t\ts\t(run index of %d runs loaded after %.2f s, %d from the checkpoint in %.2f s; ListRuns first page %.1f ms)\t\n",
			wr.RestartSeconds, wr.IndexedRuns, wr.IndexedSeconds, wr.FromCheckpoint, wr.CheckpointSeconds, wr.RestartListRunsMs)
	}
	return tw.Flush()
}
