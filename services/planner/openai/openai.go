// Package openai is the planner's provider for the OpenAI Chat Completions
// API and every server that speaks it (vLLM, Ollama, LM Studio, llama.cpp
// server), through the official Go SDK. The answer is requested as strict
// JSON-Schema structured output (response_format json_schema, strict:
// true); since strict mode allows no free-form objects, step arguments
// travel as a string holding a JSON object. Retries on 408/409/429/5xx,
// connection errors and attempt timeouts are llm.Retry's (the SDK's are
// off): bounded by MaxRetries, CallTimeout per attempt and RetryBudget in
// all, honouring Retry-After and retry-after-ms up to MaxRetryAfter.
package openai

import (
	"context"
	"errors"
	"net/http"
	"strings"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/prompt"
)

// Provider calls the Chat Completions API.
type Provider struct {
	client oai.Client
	cfg    llm.ProviderConfig
}

// New returns a provider for cfg, whose BaseURL and Model must be set.
func New(cfg llm.ProviderConfig) *Provider {
	withClient := func(c *http.Client) option.RequestOption { return option.WithHTTPClient(c) }
	return &Provider{
		cfg:    cfg,
		client: oai.NewClient(llm.SDKOptions(cfg, option.WithBaseURL, option.WithAPIKey, option.WithMaxRetries, withClient)...),
	}
}

// GenAIProvider is the provider's gen_ai.provider.name.
func (p *Provider) GenAIProvider() string { return "openai" }

// Complete sends one chat completion request.
func (p *Provider) Complete(ctx context.Context, call llm.Call) (llm.Reply, error) {
	msgs := make([]oai.ChatCompletionMessageParamUnion, 0, len(call.Turns)+1)
	msgs = append(msgs, oai.SystemMessage(call.System))
	for _, t := range call.Turns {
		if t.Role == llm.RoleAssistant {
			msgs = append(msgs, oai.AssistantMessage(t.Text))
		} else {
			msgs = append(msgs, oai.UserMessage(t.Text))
		}
	}
	desc := "The next plan revision, or a stop."
	if call.Answer != nil {
		desc = call.Answer.Description
	}
	params := oai.ChatCompletionNewParams{
		Model:    shared.ChatModel(p.cfg.Model),
		Messages: msgs,
		ResponseFormat: oai.ChatCompletionNewParamsResponseFormatUnion{
			OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
				JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{
					Name:        call.SchemaName(),
					Description: oai.String(desc),
					Strict:      oai.Bool(true),
					Schema:      call.AnswerJSONSchema(prompt.ArgsString),
				},
			},
		},
	}
	if call.MaxOutputTokens > 0 {
		params.MaxCompletionTokens = oai.Int(call.MaxOutputTokens)
	}
	if p.cfg.Temperature != nil {
		params.Temperature = oai.Float(*p.cfg.Temperature)
	}
	return llm.Retry(ctx, "openai", p.cfg, func(ctx context.Context) (llm.Reply, error) { return p.once(ctx, params) })
}

// once sends one attempt.
func (p *Provider) once(ctx context.Context, params oai.ChatCompletionNewParams) (llm.Reply, error) {
	resp, err := p.client.Chat.Completions.New(ctx, params)
	if err != nil {
		return llm.Reply{}, p.classify(ctx, err)
	}
	reply := llm.Reply{
		Model: resp.Model,
		Usage: llm.Usage{Input: resp.Usage.PromptTokens, Output: resp.Usage.CompletionTokens},
	}
	if len(resp.Choices) == 0 {
		return reply, &llm.ProviderError{Provider: "openai", Kind: llm.ErrUnavailable, Detail: "response has no choices"}
	}
	ch := resp.Choices[0]
	reply.Text = ch.Message.Content
	reply.Refusal = ch.Message.Refusal
	reply.Truncated = ch.FinishReason == "length"
	if ch.FinishReason == "content_filter" && reply.Refusal == "" {
		reply.Refusal = "the answer was withheld by the provider's content filter"
	}
	return reply, nil
}

func (p *Provider) classify(ctx context.Context, err error) error {
	var apiErr *oai.Error
	if errors.As(err, &apiErr) {
		var h http.Header
		if apiErr.Response != nil {
			h = apiErr.Response.Header
		}
		return llm.CallError(ctx, "openai", err, apiErr.StatusCode, strings.TrimSpace(apiErr.Message), h, p.cfg.APIKey, p.cfg.CallTimeout)
	}
	return llm.CallError(ctx, "openai", err, 0, "", nil, p.cfg.APIKey, p.cfg.CallTimeout)
}
