// Package conformance is the executor conformance suite (README.md): it
// plays the supervisor's part of the executor protocol against an
// executor started as a subprocess. This file holds what the suite and
// the executors under test share: the environment of the contract and
// the specs of the pool "conf" tools.
package conformance

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Environment variables the suite sets for the executor under test.
const (
	EnvNATSURL    = "CONFORMANCE_NATS_URL"
	EnvPool       = "CONFORMANCE_POOL"
	EnvVerifyKeys = "CONFORMANCE_VERIFY_KEYS"
	EnvRecordFile = "CONFORMANCE_RECORD_FILE"
	EnvAckWaitMS  = "CONFORMANCE_ACK_WAIT_MS"
	EnvMaxDeliver = "CONFORMANCE_MAX_DELIVER"
	EnvGraceMS    = "CONFORMANCE_GRACE_MS"
)

// Pool is the pool the executor under test serves.
const Pool = "conf"

// Tool names.
const (
	ToolEcho  = "conf.echo"
	ToolWrite = "conf.write"
	ToolSlow  = "conf.slow"
)

// JSON Schemas of the tools, as README.md lists them.
const (
	EchoArgsSchema   = `{"type":"object","properties":{"text":{"type":"string","maxLength":1000}},"required":["text"],"additionalProperties":false}`
	EchoOutputSchema = `{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`

	WriteArgsSchema   = `{"type":"object","properties":{"key":{"type":"string","pattern":"^[a-z0-9_-]{1,64}$"},"value":{"type":"string"},"sleep_ms":{"type":"integer","minimum":0,"maximum":60000}},"required":["key","value"],"additionalProperties":false}`
	WriteOutputSchema = `{"type":"object","properties":{"key":{"type":"string"},"value":{"type":"string"},"execution_id":{"type":"string"}},"required":["key","value","execution_id"]}`

	SlowArgsSchema   = `{"type":"object","properties":{"ms":{"type":"integer","minimum":1,"maximum":60000}},"required":["ms"],"additionalProperties":false}`
	SlowOutputSchema = `{"type":"object","properties":{"slept_ms":{"type":"integer"}},"required":["slept_ms"]}`
)

// Record is one line of the execution record file: a tool of the executor
// under test acted.
type Record struct {
	Tool        string `json:"tool"`
	RunID       string `json:"run_id"`
	StepID      string `json:"step_id"`
	Attempt     int32  `json:"attempt"`
	ExecutorID  string `json:"executor_id"`
	ExecutionID string `json:"execution_id"`
}

// Specs returns the ToolSpecs the pool must register (descriptions
// included; the suite does not compare them).
func Specs() ([]*planexv1.ToolSpec, error) {
	mk := func(name, desc, args, out string, se planexv1.SideEffect, idem, approval bool) (*planexv1.ToolSpec, error) {
		a, err := schema(args)
		if err != nil {
			return nil, fmt.Errorf("%s args_schema: %w", name, err)
		}
		o, err := schema(out)
		if err != nil {
			return nil, fmt.Errorf("%s output_schema: %w", name, err)
		}
		return &planexv1.ToolSpec{
			Name: name, Pool: Pool, Description: desc, ArgsSchema: a, OutputSchema: o,
			SideEffect: se, Idempotent: idem, RequiresApproval: approval, Version: "1",
		}, nil
	}
	var specs []*planexv1.ToolSpec
	for _, t := range []struct {
		name, desc, args, out string
		se                    planexv1.SideEffect
		idem, approval        bool
	}{
		{ToolEcho, "Returns its text.", EchoArgsSchema, EchoOutputSchema, planexv1.SideEffect_SIDE_EFFECT_READ, true, false},
		{ToolWrite, "Records a write; not idempotent, gated.", WriteArgsSchema, WriteOutputSchema, planexv1.SideEffect_SIDE_EFFECT_WRITE, false, true},
		{ToolSlow, "Sleeps ms milliseconds.", SlowArgsSchema, SlowOutputSchema, planexv1.SideEffect_SIDE_EFFECT_READ, true, false},
	} {
		s, err := mk(t.name, t.desc, t.args, t.out, t.se, t.idem, t.approval)
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	return specs, nil
}

func schema(js string) (*structpb.Struct, error) {
	s := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(js), s); err != nil {
		return nil, err
	}
	return s, nil
}
