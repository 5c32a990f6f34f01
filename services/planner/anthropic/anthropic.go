// Package anthropic is the planner's provider for the Anthropic Messages
// API through the official Go SDK. The answer is a forced tool call: the
// request declares one tool, submit_plan, whose input_schema is the answer
// schema, and tool_choice makes the model call it. A repair round answers
// that tool call with an is_error tool_result listing the problems. A
// stop_reason of "refusal" is a refusal. Retries on 408/409/429/5xx,
// connection errors and attempt timeouts are llm.Retry's (the SDK's are
// off): bounded by MaxRetries, CallTimeout per attempt and RetryBudget in
// all, honouring Retry-After and retry-after-ms up to MaxRetryAfter. The SDK's environment and profile loading is
// switched off: the key comes from Config only.
package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	sdk "github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/prompt"
)

// Provider calls the Messages API.
type Provider struct {
	client sdk.Client
	cfg    llm.ProviderConfig
}

// New returns a provider for cfg, whose BaseURL and Model must be set.
func New(cfg llm.ProviderConfig) *Provider {
	opts := llm.SDKOptions(cfg, option.WithBaseURL, option.WithAPIKey, option.WithMaxRetries,
		func(c *http.Client) option.RequestOption { return option.WithHTTPClient(c) })
	// The key comes from the config only: no environment, no profiles.
	opts = append(opts, option.WithoutEnvironmentDefaults())
	return &Provider{client: sdk.NewClient(opts...), cfg: cfg}
}

// GenAIProvider is the provider's gen_ai.provider.name.
func (p *Provider) GenAIProvider() string { return "anthropic" }

// Complete sends one Messages request with a forced submit_plan call.
func (p *Provider) Complete(ctx context.Context, call llm.Call) (llm.Reply, error) {
	msgs := make([]sdk.MessageParam, 0, len(call.Turns))
	for _, t := range call.Turns {
		switch {
		case t.Role == llm.RoleAssistant && t.CallID != "":
			msgs = append(msgs, sdk.NewAssistantMessage(sdk.NewToolUseBlock(t.CallID, json.RawMessage(t.Text), call.SchemaName())))
		case t.Role == llm.RoleAssistant:
			msgs = append(msgs, sdk.NewAssistantMessage(sdk.NewTextBlock(t.Text)))
		case t.CallID != "":
			msgs = append(msgs, sdk.NewUserMessage(sdk.NewToolResultBlock(t.CallID, t.Text, true)))
		default:
			msgs = append(msgs, sdk.NewUserMessage(sdk.NewTextBlock(t.Text)))
		}
	}
	schema := call.AnswerJSONSchema(prompt.ArgsObject)
	name, desc := call.SchemaName(), "Submit the next plan revision, or a stop. Always answer through this tool."
	if call.Answer != nil {
		desc = call.Answer.Description
	}
	var required []string
	for _, r := range schema["required"].([]any) {
		required = append(required, r.(string))
	}
	params := sdk.MessageNewParams{
		Model:     sdk.Model(p.cfg.Model),
		MaxTokens: call.MaxOutputTokens,
		System:    []sdk.TextBlockParam{{Text: call.System}},
		Messages:  msgs,
		Tools: []sdk.ToolUnionParam{{OfTool: &sdk.ToolParam{
			Name:        name,
			Description: sdk.String(desc),
			InputSchema: sdk.ToolInputSchemaParam{
				Properties:  schema["properties"],
				Required:    required,
				ExtraFields: map[string]any{"additionalProperties": false},
			},
		}}},
		ToolChoice: sdk.ToolChoiceUnionParam{OfTool: &sdk.ToolChoiceToolParam{Name: name}},
	}
	if p.cfg.Temperature != nil {
		params.Temperature = sdk.Float(*p.cfg.Temperature)
	}
	return llm.Retry(ctx, "anthropic", p.cfg, func(ctx context.Context) (llm.Reply, error) { return p.once(ctx, params, name) })
}

// once sends one attempt.
func (p *Provider) once(ctx context.Context, params sdk.MessageNewParams, name string) (llm.Reply, error) {
	msg, err := p.client.Messages.New(ctx, params)
	if err != nil {
		return llm.Reply{}, p.classify(ctx, err)
	}
	u := msg.Usage
	reply := llm.Reply{
		Model: string(msg.Model),
		Usage: llm.Usage{Input: u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens, Output: u.OutputTokens},
	}
	var texts []string
	for _, block := range msg.Content {
		switch block.Type {
		case "tool_use":
			if block.Name == name && reply.CallID == "" {
				reply.Text = string(block.Input)
				reply.CallID = block.ID
			}
		case "text":
			texts = append(texts, block.Text)
		}
	}
	switch msg.StopReason {
	case sdk.StopReasonRefusal:
		reply.Refusal = strings.TrimSpace(strings.Join(texts, " "))
		if reply.Refusal == "" {
			reply.Refusal = "stop_reason refusal"
		}
	case sdk.StopReasonMaxTokens:
		reply.Truncated = true
	}
	if reply.CallID == "" && reply.Text == "" {
		// No tool call: keep the text so the repair round can quote it.
		reply.Text = strings.Join(texts, "\n")
	}
	return reply, nil
}

func (p *Provider) classify(ctx context.Context, err error) error {
	var apiErr *sdk.Error
	if errors.As(err, &apiErr) {
		var h http.Header
		if apiErr.Response != nil {
			h = apiErr.Response.Header
		}
		return llm.CallError(ctx, "anthropic", err, apiErr.StatusCode, apiDetail(apiErr), h, p.cfg.APIKey, p.cfg.CallTimeout)
	}
	return llm.CallError(ctx, "anthropic", err, 0, "", nil, p.cfg.APIKey, p.cfg.CallTimeout)
}

// apiDetail extracts error.message from the API's error body.
func apiDetail(e *sdk.Error) string {
	var body struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(e.RawJSON()), &body); err == nil && body.Error.Message != "" {
		return body.Error.Type + ": " + body.Error.Message
	}
	return ""
}
