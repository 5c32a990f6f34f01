package catalog

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

func TestValidateAnswer(t *testing.T) {
	obj := map[string]any{"type": "object", "required": []any{"customer"}, "additionalProperties": false,
		"properties": map[string]any{"customer": map[string]any{"type": "string"}, "year": map[string]any{"type": "integer", "minimum": 2000}}}
	tests := []struct {
		name   string
		args   map[string]any
		answer any
		want   string // "" valid; else in the error
	}{
		{"default string", map[string]any{"question": "q"}, "acme", ""},
		{"default string refuses a number", map[string]any{"question": "q"}, 7.0, "answer: expected string, got number 7"},
		{"object", map[string]any{"question": "q", "schema": obj}, map[string]any{"customer": "acme", "year": 2024.0}, ""},
		{"object field", map[string]any{"question": "q", "schema": obj}, map[string]any{"customer": 1.0}, "answer.customer: expected string, got number 1"},
		{"object bound", map[string]any{"question": "q", "schema": obj}, map[string]any{"customer": "a", "year": 1999.0}, "answer.year: "},
		{"extra field", map[string]any{"question": "q", "schema": obj}, map[string]any{"customer": "a", "x": 1.0}, "answer.x"},
		{"choice", map[string]any{"question": "q", "choices": []any{"eu", "us"}}, "us", ""},
		{"not a choice", map[string]any{"question": "q", "choices": []any{"eu", "us"}}, "asia", `answer: expected one of ["eu","us"]`},
		{"null", map[string]any{"question": "q"}, nil, "answer: expected string, got null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args, err := structpb.NewStruct(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			in, err := InputOf(args)
			if err != nil {
				t.Fatal(err)
			}
			var v *structpb.Value
			if tt.answer != nil {
				if v, err = structpb.NewValue(tt.answer); err != nil {
					t.Fatal(err)
				}
			}
			err = ValidateAnswer(in.GetSchema(), v)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !errors.Is(err, ErrInvalidAnswer) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want an invalid answer with %q", err, tt.want)
			}
		})
	}
}

func TestInputOfRefusesASchemaThatDoesNotCompile(t *testing.T) {
	args, _ := structpb.NewStruct(map[string]any{"question": "q", "schema": map[string]any{"type": 5.0}})
	if _, err := InputOf(args); err == nil || !strings.HasPrefix(err.Error(), "args.schema: ") {
		t.Fatalf("InputOf: %v", err)
	}
	if spec, ok := Static(nil).Tool(HumanInput); !ok || spec.GetPool() != "human" {
		t.Fatalf("the static catalog lacks %s", HumanInput)
	}
}
