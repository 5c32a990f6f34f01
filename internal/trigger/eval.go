package trigger

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// maxCost bounds one expression's evaluation (CEL cost units): a filter
// cannot spin a supervisor.
const maxCost = 1_000_000

// Limits of what an event makes (the API's StartRun limits).
const (
	maxGoal       = 4096
	maxLabelValue = 256
	// MaxPayload is the largest event evaluated (larger ones are
	// rejected); the webhook refuses larger bodies.
	MaxPayload = 1 << 20
)

// Program is a trigger's compiled expressions.
type Program struct {
	filter, goal, inputs, key cel.Program
	labels                    map[string]cel.Program
	labelKeys                 []string
}

// Run is what an event starts.
type Run struct {
	// Goal, Inputs and Labels of the run (Labels without LabelTrigger and
	// LabelEvent, which the consumer adds).
	Goal   string
	Inputs *structpb.Struct
	Labels map[string]string
	// Key is the event's idempotency key (RunKey makes the run's).
	Key string
}

// Rejection is an event a trigger cannot evaluate; Reason says why
// without repeating the payload.
type Rejection struct{ Reason string }

func (r *Rejection) Error() string { return "rejected: " + r.Reason }

// ErrFiltered is an event the filter is false for.
var ErrFiltered = errors.New("filtered out")

func environment() (*cel.Env, error) {
	return cel.NewEnv(
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Lists(),
		ext.Encoders(),
		cel.Variable("event", cel.DynType),
		cel.Variable("subject", cel.StringType),
		cel.Variable("headers", cel.MapType(cel.StringType, cel.StringType)),
	)
}

// Compile compiles a trigger's expressions; errors name the field
// ("trigger.filter: ...").
func Compile(t *planexv1.Trigger) (*Program, error) {
	env, err := environment()
	if err != nil {
		return nil, fmt.Errorf("trigger cel environment: %w", err)
	}
	compile := func(field, expr string, want ...*cel.Type) (cel.Program, error) {
		if len(expr) > maxExpr {
			return nil, fmt.Errorf("%s: at most %d bytes", field, maxExpr)
		}
		a, iss := env.Compile(expr)
		if iss.Err() != nil {
			return nil, fmt.Errorf("%s: %w", field, iss.Err())
		}
		ok := a.OutputType() == cel.DynType
		for _, w := range want {
			ok = ok || a.OutputType().IsExactType(w)
		}
		if !ok {
			return nil, fmt.Errorf("%s: the expression is of type %s, want %s", field, a.OutputType(), want[0])
		}
		return env.Program(a, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(maxCost))
	}
	var errs []error
	p := &Program{labels: map[string]cel.Program{}}
	if t.GetFilter() != "" {
		p.filter, err = compile("trigger.filter", t.GetFilter(), cel.BoolType)
		errs = append(errs, err)
	}
	if t.GetGoal() == "" {
		errs = append(errs, errors.New("trigger.goal: required (a CEL string expression, e.g. \"Triage \" + event.title)"))
	} else {
		p.goal, err = compile("trigger.goal", t.GetGoal(), cel.StringType)
		errs = append(errs, err)
	}
	if t.GetInputs() != "" {
		p.inputs, err = compile("trigger.inputs", t.GetInputs(), cel.MapType(cel.StringType, cel.DynType), cel.MapType(cel.DynType, cel.DynType))
		errs = append(errs, err)
	}
	if t.GetIdempotencyKey() == "" {
		errs = append(errs, errors.New("trigger.idempotency_key: required (a CEL string expression identifying the event, e.g. event.id)"))
	} else {
		p.key, err = compile("trigger.idempotency_key", t.GetIdempotencyKey(), cel.StringType)
		errs = append(errs, err)
	}
	for k, expr := range t.GetLabels() {
		prg, err := compile(fmt.Sprintf("trigger.labels[%q]", k), expr, cel.StringType)
		errs = append(errs, err)
		p.labels[k] = prg
		p.labelKeys = append(p.labelKeys, k)
	}
	sort.Strings(p.labelKeys)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// Digest is the hex SHA-256 of a payload, what a rejection keeps of it.
func Digest(payload []byte) string {
	sum := sha256.Sum256(payload)
	return hex.EncodeToString(sum[:])
}

// Evaluate evaluates an event: the run it starts, ErrFiltered, or a
// *Rejection (not JSON, an expression's error, an empty key or goal).
func (p *Program) Evaluate(subject string, headers map[string]string, payload []byte) (*Run, error) {
	if len(payload) > MaxPayload {
		return nil, &Rejection{Reason: fmt.Sprintf("payload of %d bytes: at most %d", len(payload), MaxPayload)}
	}
	var event any
	if err := json.Unmarshal(payload, &event); err != nil {
		return nil, &Rejection{Reason: "not JSON"}
	}
	if headers == nil {
		headers = map[string]string{}
	}
	vars := map[string]any{"event": event, "subject": subject, "headers": headers}
	eval := func(field string, prg cel.Program) (ref.Val, error) {
		v, _, err := prg.Eval(vars)
		if err != nil {
			return nil, &Rejection{Reason: field + ": " + err.Error()}
		}
		return v, nil
	}
	str := func(field string, prg cel.Program) (string, error) {
		v, err := eval(field, prg)
		if err != nil {
			return "", err
		}
		s, ok := v.(types.String)
		if !ok {
			return "", &Rejection{Reason: fmt.Sprintf("%s: got a %s, want a string", field, v.Type().TypeName())}
		}
		return string(s), nil
	}
	if p.filter != nil {
		v, err := eval("filter", p.filter)
		if err != nil {
			return nil, err
		}
		b, ok := v.(types.Bool)
		if !ok {
			return nil, &Rejection{Reason: fmt.Sprintf("filter: got a %s, want a bool", v.Type().TypeName())}
		}
		if !b {
			return nil, ErrFiltered
		}
	}
	var r Run
	var err error
	if r.Key, err = str("idempotency_key", p.key); err != nil {
		return nil, err
	}
	if r.Key == "" {
		return nil, &Rejection{Reason: "idempotency_key: empty"}
	}
	if r.Goal, err = str("goal", p.goal); err != nil {
		return nil, err
	}
	if r.Goal == "" || len(r.Goal) > maxGoal {
		return nil, &Rejection{Reason: fmt.Sprintf("goal: %d bytes, want 1 to %d", len(r.Goal), maxGoal)}
	}
	if p.inputs != nil {
		v, err := eval("inputs", p.inputs)
		if err != nil {
			return nil, err
		}
		native, err := v.ConvertToNative(reflect.TypeOf(&structpb.Struct{}))
		if err != nil {
			return nil, &Rejection{Reason: "inputs: want a map with string keys: " + err.Error()}
		}
		r.Inputs = native.(*structpb.Struct)
	}
	for _, k := range p.labelKeys {
		s, err := str(fmt.Sprintf("labels[%q]", k), p.labels[k])
		if err != nil {
			return nil, err
		}
		if len(s) > maxLabelValue {
			return nil, &Rejection{Reason: fmt.Sprintf("labels[%q]: %d bytes, at most %d", k, len(s), maxLabelValue)}
		}
		if r.Labels == nil {
			r.Labels = map[string]string{}
		}
		r.Labels[k] = s
	}
	return &r, nil
}
