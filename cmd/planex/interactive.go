package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// interactive reports whether `planex run` may ask at the terminal: both
// stdin and stdout are terminals.
func interactive() bool {
	return term.IsTerminal(int(os.Stdin.Fd())) && term.IsTerminal(int(os.Stdout.Fd()))
}

// prompter asks a person at a terminal how to decide the gates a run waits
// at: approve, reject (with a reason, optionally stopping the run), edit
// the step's arguments in $EDITOR, or skip (leave the gate open).
type prompter struct {
	in     *bufio.Reader
	out    io.Writer
	editor string // command line of the editor ($VISUAL, $EDITOR, vi)
	actor  string // GateDecided.actor
	tmpDir string // where the arguments are edited ("" : os.TempDir)
}

// newPrompter reads answers from in and writes questions to out.
func newPrompter(in io.Reader, out io.Writer) *prompter {
	editor := os.Getenv("VISUAL")
	if editor == "" {
		editor = os.Getenv("EDITOR")
	}
	if editor == "" {
		editor = "vi"
	}
	return &prompter{in: bufio.NewReader(in), out: out, editor: editor, actor: os.Getenv("USER")}
}

// errNoAnswer is the end of the prompter's input: the gates stay open.
var errNoAnswer = errors.New("no answer")

// followInteractive follows a run like follow and, each time it waits at
// gates, asks for each open gate what to do. It returns when the run ends
// or when every open gate was skipped (the run keeps waiting, as without a
// terminal).
func followInteractive(ctx context.Context, client planexv1.SupervisorServiceClient, addr, runID string, view *liveView, p *prompter) (*planexv1.Run, error) {
	var from uint64
	for {
		run, err := follow(ctx, client, addr, runID, from, view)
		if err != nil || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
			return run, err
		}
		resp, err := client.ListGates(ctx, &planexv1.ListGatesRequest{RunId: runID})
		if err != nil {
			return nil, rpcError(addr, err)
		}
		// The prompts go below the live view: its next drawing starts
		// after them instead of moving up over them.
		view.lines = 0
		decided := 0
		for _, og := range resp.GetGates() {
			ok, err := p.decide(ctx, client, run, og)
			if errors.Is(err, errNoAnswer) {
				return run, nil
			}
			if err != nil {
				return nil, rpcError(addr, err)
			}
			if ok {
				decided++
			}
		}
		if decided == 0 {
			return run, nil
		}
		from = run.GetLastSequence() + 1
	}
}

// decide asks about one gate until it is decided or skipped; it reports
// whether a decision was recorded. A decision the server refuses (an edit
// that breaks the tool's schema or a policy) is shown and asked again.
func (p *prompter) decide(ctx context.Context, client planexv1.SupervisorServiceClient, run *planexv1.Run, og *planexv1.OpenGate) (bool, error) {
	g := og.GetGate()
	if g.GetKind() == planexv1.GateKind_GATE_KIND_INPUT {
		return p.answer(ctx, client, og) // a question (answer.go)
	}
	args := plannedArgs(run, g)
	p.describe(og, args)
	var edited string
	for {
		choices := "[a]pprove, [r]eject, [e]dit arguments, [s]kip"
		if g.GetKind() != planexv1.GateKind_GATE_KIND_STEP {
			choices = "[a]pprove, [r]eject, [s]kip"
		}
		answer, err := p.ask(fmt.Sprintf("gate %s: %s? ", g.GetId(), choices))
		if err != nil {
			return false, err
		}
		d := &planexv1.GateDecision{GateId: g.GetId()}
		switch strings.ToLower(answer) {
		case "a", "approve":
			d.Decision, d.Comment = planexv1.DecisionKind_DECISION_KIND_APPROVE, "approved at the terminal (planex run)"
		case "r", "reject":
			if d.Comment, err = p.ask("reason (the planner gets it): "); err != nil {
				return false, err
			}
			d.Decision = planexv1.DecisionKind_DECISION_KIND_REJECT
			if g.GetStopOnReject() {
				fmt.Fprintln(p.out, "the gate's rule stops the run on a rejection")
			} else {
				yn, err := p.ask("stop the run instead of replanning? [y/N] ")
				if err != nil {
					return false, err
				}
				d.StopRun = strings.EqualFold(yn, "y") || strings.EqualFold(yn, "yes")
			}
		case "e", "edit":
			if g.GetKind() != planexv1.GateKind_GATE_KIND_STEP {
				fmt.Fprintln(p.out, "a plan gate can be approved or rejected, not edited")
				continue
			}
			if edited == "" {
				edited = args
			}
			text, err := p.edit(ctx, g.GetId(), edited)
			if err != nil {
				fmt.Fprintf(p.out, "edit: %v\n", err)
				continue
			}
			edited = text
			var s structpb.Struct
			if err := protojson.Unmarshal([]byte(text), &s); err != nil {
				fmt.Fprintf(p.out, "edited arguments: not a JSON object: %v\n", err)
				continue
			}
			d.Decision, d.EditedArgs, d.Comment = planexv1.DecisionKind_DECISION_KIND_EDIT, &s, "arguments edited at the terminal (planex run)"
		case "s", "skip":
			fmt.Fprintf(p.out, "gate %s left open (planex runs approve|reject %s %s)\n", g.GetId(), run.GetId(), g.GetId())
			return false, nil
		default:
			fmt.Fprintf(p.out, "%q: answer a, r, e or s\n", answer)
			continue
		}
		_, err = client.Decide(ctx, &planexv1.DecideRequest{RunId: run.GetId(), Actor: p.actor, Decisions: []*planexv1.GateDecision{d}})
		switch status.Code(err) {
		case codes.OK:
			fmt.Fprintf(p.out, "gate %s: %s\n", g.GetId(), statusName(d.GetDecision(), "DECISION_KIND_"))
			return true, nil
		case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied:
			// The field error (edited_args: …) or why the caller may not
			// decide; ask again.
			fmt.Fprintf(p.out, "refused: %s\n", status.Convert(err).Message())
			continue
		}
		return false, err
	}
}

// describe prints what the gate holds back.
func (p *prompter) describe(og *planexv1.OpenGate, args string) {
	g := og.GetGate()
	fmt.Fprintf(p.out, "\nrun %s waits at gate %s (%s", og.GetRunId(), g.GetId(), statusName(g.GetKind(), "GATE_KIND_"))
	if og.GetTool() != "" {
		fmt.Fprintf(p.out, ", tool %s", og.GetTool())
	}
	fmt.Fprintf(p.out, "): %s\n", g.GetReason())
	if g.GetStopOnReject() {
		fmt.Fprintln(p.out, "rejecting it stops the run (on_reject: stop)")
	}
	if args != "" {
		fmt.Fprintf(p.out, "arguments: %s\n", args)
	}
}

// ask prints a question and reads one line; the end of the input is
// errNoAnswer.
func (p *prompter) ask(q string) (string, error) {
	fmt.Fprint(p.out, q)
	line, err := p.in.ReadString('\n')
	switch {
	case err == nil, errors.Is(err, io.EOF) && strings.TrimSpace(line) != "":
		return strings.TrimSpace(line), nil
	case errors.Is(err, io.EOF):
		fmt.Fprintln(p.out)
		return "", errNoAnswer
	}
	return "", err
}

// edit opens the editor on text in a temporary file and returns what the
// person saved.
func (p *prompter) edit(ctx context.Context, gateID, text string) (string, error) {
	f, err := os.CreateTemp(p.tmpDir, "planex-"+strings.ReplaceAll(gateID, string(filepath.Separator), "_")+"-*.json")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(text + "\n"); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	argv := strings.Fields(p.editor)
	if len(argv) == 0 {
		return "", errors.New("no editor: set $EDITOR")
	}
	cmd := exec.CommandContext(ctx, argv[0], append(argv[1:], f.Name())...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, p.out, p.out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("editor %s: %w", argv[0], err)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// plannedArgs are the arguments of a step gate's step as planned, as
// indented JSON ("" for plan gates).
func plannedArgs(run *planexv1.Run, g *planexv1.Gate) string {
	if g.GetKind() != planexv1.GateKind_GATE_KIND_STEP {
		return ""
	}
	for _, p := range run.GetPlans() {
		if p.GetRevision() != g.GetPlanRevision() {
			continue
		}
		for _, s := range p.GetSteps() {
			if s.GetId() == g.GetStepId() {
				b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(s.GetArgs())
				if err != nil {
					return "{}"
				}
				return string(b)
			}
		}
	}
	return "{}"
}
