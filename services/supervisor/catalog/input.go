package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
)

// HumanInput is the built-in tool that asks a person a question: its step
// opens an input gate (GATE_KIND_INPUT) instead of going to a pool, and
// the answer, valid against the step's schema, is its output
// (docs/human-input.md).
const HumanInput = "human.input"

// humanInputSpec is the spec of HumanInput the catalog serves.
var humanInputSpec = func() *planexv1.ToolSpec {
	args, err := structpb.NewStruct(map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []any{"question"},
		"properties": map[string]any{
			"question": map[string]any{"type": "string", "minLength": 1, "maxLength": 4096,
				"description": "The question, as the person sees it."},
			"schema": map[string]any{"type": "object",
				"description": `JSON schema (draft 2020-12) the answer must satisfy; default {"type": "string"}.`},
			"choices": map[string]any{"type": "array", "minItems": 1, "maxItems": 100,
				"description": "Answers to choose from: the answer must be one of them (the schema's enum)."},
		},
	})
	if err != nil {
		panic(fmt.Sprintf("human.input args schema: %v", err)) // a constant: cannot fail
	}
	return &planexv1.ToolSpec{
		Name: HumanInput, Pool: "human",
		Description: "Ask a person a question and wait for the answer; the run waits like at an approval gate " +
			"(SLA, escalation and approvers as policies set them). The answer, valid against `schema` " +
			"(or one of `choices`), is the step's output, e.g. ${{ steps.<id>.output }} or ${{ steps.<id>.output.field }}.",
		ArgsSchema: args,
		SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ,
		Idempotent: true,
		Version:    "1",
	}
}()

// HumanInputSpec returns the spec of the built-in human.input tool. The
// caller must not modify it.
func HumanInputSpec() *planexv1.ToolSpec { return humanInputSpec }

// addHumanInput serves HumanInput in c, replacing any registration of
// its name: its steps never go to a pool.
func addHumanInput(c *Catalog) {
	c.specs[HumanInput] = humanInputSpec
	c.replicas[HumanInput] = []string{"supervisor"}
	delete(c.absent, HumanInput)
}

// Builtin reports whether tool is served by the supervisor itself rather
// than by an executor pool (human.input, run.child): no executor serves
// its pool.
func Builtin(tool string) bool { return tool == HumanInput || tool == ChildTool }

// MaxAnswerBytes bounds an answer to an input gate (its proto size): it
// is recorded in the run log and passed to later steps as arguments.
const MaxAnswerBytes = 64 << 10

// InputOf builds what a human.input step asks from its resolved arguments
// (already valid against the tool's schema): the answer's schema is the
// step's, {"type": "string"} when it has none, with the choices as its
// enum. It fails, naming the argument, when the schema does not compile.
func InputOf(args *structpb.Struct) (*planexv1.HumanInput, error) {
	f := args.GetFields()
	in := &planexv1.HumanInput{Question: f["question"].GetStringValue()}
	if s := f["schema"].GetStructValue(); s != nil {
		in.Schema = proto.CloneOf(s)
	} else {
		in.Schema = &structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("string")}}
	}
	if c := f["choices"].GetListValue(); c != nil {
		in.Choices = c.GetValues()
		in.Schema.Fields["enum"] = structpb.NewListValue(&structpb.ListValue{Values: in.Choices})
	}
	if err := ValidateAnswer(in.GetSchema(), nil); err != nil && !errors.Is(err, ErrInvalidAnswer) {
		return nil, fmt.Errorf("args.schema: %w", err)
	}
	return in, nil
}

// ErrInvalidAnswer is matched by the *AnswerError ValidateAnswer returns
// for an answer its schema refuses.
var ErrInvalidAnswer = errors.New("invalid answer")

// ValidateAnswer checks answer (nil: JSON null) against schema with the
// JSON-schema validator tool arguments use. A refused answer gives an
// *AnswerError; a schema that does not compile gives another error.
func ValidateAnswer(schema *structpb.Struct, answer *structpb.Value) error {
	if answer == nil {
		answer = structpb.NewNullValue()
	}
	// The answer is validated as the one property of an object, so the
	// schema cache of tool arguments (keyed by a name, here the schema's
	// hash) serves it.
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(schema)
	if err != nil {
		return fmt.Errorf("encode answer schema: %w", err)
	}
	sum := sha256.Sum256(b)
	wrapper := &structpb.Struct{Fields: map[string]*structpb.Value{
		"type":       structpb.NewStringValue("object"),
		"required":   structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("answer")}}),
		"properties": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"answer": structpb.NewStructValue(schema)}}),
	}}
	spec := &planexv1.ToolSpec{Name: HumanInput + "#" + hex.EncodeToString(sum[:12]), ArgsSchema: wrapper}
	err = plan.ValidateArgs(spec, &structpb.Struct{Fields: map[string]*structpb.Value{"answer": answer}})
	var verr *plan.ValidationError
	if !errors.As(err, &verr) {
		if err != nil {
			return errors.New(strings.ReplaceAll(err.Error(), spec.GetName(), HumanInput))
		}
		return nil
	}
	msgs := make([]string, 0, len(verr.Problems))
	for _, p := range verr.Problems {
		field := strings.TrimPrefix(p.Field, "args.")
		if field == "args" || field == "" {
			field = "answer"
		}
		msgs = append(msgs, field+": "+p.Message)
	}
	return &AnswerError{msg: strings.Join(msgs, "; ")}
}

// AnswerError is an answer its schema refuses: its text names each path
// in the answer ("answer", "answer.customer") and the schema's message.
// errors.Is matches it against ErrInvalidAnswer.
type AnswerError struct{ msg string }

func (e *AnswerError) Error() string { return e.msg }

// Is matches ErrInvalidAnswer.
func (e *AnswerError) Is(target error) bool { return target == ErrInvalidAnswer }
