package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// runsAnswerCmd answers a human.input step: the run's input gate, named
// by its id or its step's, or the only one open.
func runsAnswerCmd() *cobra.Command {
	var (
		cf      clientFlags
		actor   string
		comment string
		value   string
		choice  string
	)
	cmd := &cobra.Command{
		Use:   "answer RUN_ID [STEP_ID|GATE_ID]",
		Short: "Answer the question a human.input step asks (--value JSON, --choice, or a prompt at a terminal)",
		Long: "Answer the question a human.input step of a run asks: the answer, checked against the step's JSON schema,\n" +
			"becomes the step's output. With neither --value nor --choice, and a terminal, the question is shown and the\n" +
			"answer read from it. A wrong answer is refused with the schema's message; the run keeps waiting.\n" +
			"To refuse to answer, reject the gate: planex runs reject RUN_ID GATE_ID --comment why.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if value != "" && choice != "" {
				return usageError(cmd, "--value and --choice: pass one of them")
			}
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			og, err := inputGate(cmd, client, cf.addr, args)
			if err != nil {
				return err
			}
			g := og.GetGate()
			var answer *structpb.Value
			switch {
			case value != "":
				if answer, err = parseAnswer(value); err != nil {
					return usageError(cmd, "--value: %v", err)
				}
			case choice != "":
				if answer, err = pickChoice(g.GetInput(), choice); err != nil {
					return usageError(cmd, "--choice: %v", err)
				}
			case term.IsTerminal(int(os.Stdin.Fd())):
				if answer, err = promptAnswer(bufio.NewReader(cmd.InOrStdin()), cmd.ErrOrStderr(), og); err != nil {
					return err
				}
			default:
				return usageError(cmd, "gate %s asks %q: pass the answer with --value JSON or --choice (stdin is not a terminal)", g.GetId(), g.GetInput().GetQuestion())
			}
			resp, err := client.Decide(cmd.Context(), &planexv1.DecideRequest{RunId: og.GetRunId(), GateId: g.GetId(), Answer: answer, Actor: actor, Comment: comment})
			if err != nil {
				return rpcError(cf.addr, err)
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), resp.GetRun())
			}
			b, _ := protojson.Marshal(answer)
			fmt.Fprintf(cmd.OutOrStdout(), "gate %s of run %s: answered %s\n", g.GetId(), og.GetRunId(), b)
			return nil
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&actor, "actor", os.Getenv("USER"), "who answers (recorded in the run log)")
	cmd.Flags().StringVar(&comment, "comment", "", "comment recorded with the answer")
	cmd.Flags().StringVar(&value, "value", "", `the answer as JSON ("acme" or {"customer": "acme"}); a bare word that is not JSON is taken as a string`)
	cmd.Flags().StringVar(&choice, "choice", "", "the answer as one of the step's choices: its number (1, 2, ...) or its value")
	return cmd
}

// inputGate finds the open input gate args name: the run's only one, or
// the one whose id or step id is args[1].
func inputGate(cmd *cobra.Command, client planexv1.SupervisorServiceClient, addr string, args []string) (*planexv1.OpenGate, error) {
	resp, err := client.ListGates(cmd.Context(), &planexv1.ListGatesRequest{RunId: args[0]})
	if err != nil {
		return nil, rpcError(addr, err)
	}
	var open []*planexv1.OpenGate
	var ids []string
	for _, og := range resp.GetGates() {
		if og.GetGate().GetKind() != planexv1.GateKind_GATE_KIND_INPUT {
			continue
		}
		if len(args) == 2 && og.GetGate().GetId() != args[1] && og.GetGate().GetStepId() != args[1] {
			continue
		}
		open = append(open, og)
		ids = append(ids, og.GetGate().GetId())
	}
	switch {
	case len(open) == 1:
		return open[0], nil
	case len(open) > 1:
		return nil, usageError(cmd, "run %s asks %d questions (%s): name the step or gate", args[0], len(open), strings.Join(ids, ", "))
	case len(args) == 2:
		return nil, &exitError{code: exitUsage, msg: fmt.Sprintf("run %s has no open input gate %q (planex gates --run %s lists its open gates)", args[0], args[1], args[0])}
	}
	return nil, nothingToDecide(cmd, client, addr, args[0], "answer")
}

// parseAnswer reads an answer given as JSON; text that is not JSON is a
// string (so --value acme needs no quotes).
func parseAnswer(s string) (*structpb.Value, error) {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t := strings.TrimSpace(s)
		if t == "" || strings.ContainsAny(t[:1], `{["`) {
			return nil, fmt.Errorf("not valid JSON: %v", err)
		}
		return structpb.NewStringValue(s), nil
	}
	out, err := structpb.NewValue(v)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// pickChoice finds a choice by its 1-based number, its JSON text or, for a
// string choice, its text.
func pickChoice(in *planexv1.HumanInput, s string) (*structpb.Value, error) {
	choices := in.GetChoices()
	if len(choices) == 0 {
		return nil, fmt.Errorf("the question offers no choices; pass --value")
	}
	for _, c := range choices {
		b, _ := protojson.Marshal(c)
		if string(b) == s || (isString(c) && c.GetStringValue() == s) {
			return c, nil
		}
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 1 && n <= len(choices) {
		return choices[n-1], nil
	}
	return nil, fmt.Errorf("%q is not one of the choices %s (pass one of them or its number)", s, choiceList(choices))
}

func isString(v *structpb.Value) bool {
	_, ok := v.GetKind().(*structpb.Value_StringValue)
	return ok
}

func choiceList(choices []*structpb.Value) string {
	parts := make([]string, len(choices))
	for i, c := range choices {
		b, _ := protojson.Marshal(c)
		parts[i] = fmt.Sprintf("%d) %s", i+1, b)
	}
	return strings.Join(parts, ", ")
}

// promptAnswer shows the question (with its choices or the schema of the
// answer) and reads the answer from one line.
func promptAnswer(in *bufio.Reader, out io.Writer, og *planexv1.OpenGate) (*structpb.Value, error) {
	fmt.Fprint(out, describeQuestion(out, og))
	line, err := in.ReadString('\n')
	if err != nil && line == "" {
		return nil, fmt.Errorf("read the answer: %w", err)
	}
	return answerFromLine(og.GetGate().GetInput(), strings.TrimRight(line, "\r\n"))
}

// describeQuestion writes the question of input gate og with its choices,
// or the schema of a structured answer, and returns the prompt to read the
// answer with.
func describeQuestion(out io.Writer, og *planexv1.OpenGate) string {
	q := og.GetGate().GetInput()
	fmt.Fprintf(out, "Run %s, step %s asks:\n  %s\n", og.GetRunId(), og.GetGate().GetStepId(), q.GetQuestion())
	switch {
	case len(q.GetChoices()) > 0:
		for i, c := range q.GetChoices() {
			b, _ := protojson.Marshal(c)
			fmt.Fprintf(out, "  %d) %s\n", i+1, b)
		}
		return "Choice (number or value): "
	case stringAnswer(q):
		return "Answer: "
	}
	b, _ := protojson.Marshal(q.GetSchema())
	fmt.Fprintf(out, "The answer is JSON matching %s\n", b)
	return "Answer (JSON): "
}

func stringAnswer(q *planexv1.HumanInput) bool {
	return q.GetSchema().GetFields()["type"].GetStringValue() == "string"
}

// answerFromLine reads an answer typed on one line: a choice's number or
// value, the text itself for a string answer, JSON otherwise.
func answerFromLine(q *planexv1.HumanInput, line string) (*structpb.Value, error) {
	switch {
	case len(q.GetChoices()) > 0:
		return pickChoice(q, strings.TrimSpace(line))
	case stringAnswer(q):
		return structpb.NewStringValue(line), nil
	}
	return parseAnswer(line)
}

// answer asks the question of input gate og at the terminal (planex run)
// until the supervisor takes an answer (true) or the person skips it with
// an empty line; a refused answer is shown with the schema's message and
// asked again.
func (p *prompter) answer(ctx context.Context, client planexv1.SupervisorServiceClient, og *planexv1.OpenGate) (bool, error) {
	prompt := describeQuestion(p.out, og)
	for {
		line, err := p.ask(prompt + "(empty: skip) ")
		if err != nil || line == "" {
			return false, err
		}
		v, err := answerFromLine(og.GetGate().GetInput(), line)
		if err != nil {
			fmt.Fprintln(p.out, err)
			continue
		}
		_, err = client.Decide(ctx, &planexv1.DecideRequest{RunId: og.GetRunId(), GateId: og.GetGate().GetId(), Answer: v, Actor: p.actor})
		if status.Code(err) == codes.InvalidArgument {
			fmt.Fprintf(p.out, "refused: %s\n", status.Convert(err).Message())
			continue
		}
		return err == nil, err
	}
}
