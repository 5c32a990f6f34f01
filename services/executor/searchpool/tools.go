package searchpool

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

// Version is reported in the tool specs.
const Version = "1"

// newQueryTool is search.query.
func newQueryTool(p *Pool, b *runner.SchemaBuilder) runner.Tool {
	return runner.NewTool(&planexv1.ToolSpec{
		Name: "search.query",
		Pool: "search",
		Description: "Full-text search over the runbooks and policies index. Returns {hits: [{id, title, snippet, score}], total}, best first; " +
			"matched terms are **bold** in snippets. Use plain words (\"failed payment retries\").",
		ArgsSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"query": map[string]any{"type": "string", "minLength": 1, "maxLength": MaxQueryBytes},
				"limit": map[string]any{"type": "integer", "minimum": 1, "maximum": MaxLimit, "description": fmt.Sprintf("hits to return, default %d", DefaultLimit)},
			},
			"required":             []any{"query"},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"hits": map[string]any{"type": "array", "items": map[string]any{"type": "object", "properties": map[string]any{
					"id": map[string]any{"type": "string"}, "title": map[string]any{"type": "string"},
					"snippet": map[string]any{"type": "string"}, "score": map[string]any{"type": "number"},
				}}},
				"total": map[string]any{"type": "integer"},
			},
		}),
		SideEffect:     planexv1.SideEffect_SIDE_EFFECT_READ,
		DefaultTimeout: durationpb.New(10 * time.Second),
		Idempotent:     true,
		Version:        Version,
	}, p.runQuery)
}

func (p *Pool) runQuery(ctx context.Context, c runner.Call) (any, error) {
	f := c.Args.GetFields()
	text := strings.TrimSpace(f["query"].GetStringValue())
	if text == "" {
		return nil, runner.InvalidArgument("args.query", "must not be empty")
	}
	if len(text) > MaxQueryBytes {
		return nil, runner.InvalidArgument("args.query", "%d bytes exceed the limit of %d", len(text), MaxQueryBytes)
	}
	limit, terr := runner.IntArg(c.Args, "limit", DefaultLimit, 1, MaxLimit)
	if terr != nil {
		return nil, terr
	}
	ctx, span := p.tracer.Start(ctx, "search query", trace.WithAttributes(
		attribute.Int("planex.search.query_length", len(text)), attribute.Int("planex.search.limit", limit)))
	defer span.End()
	out, err := p.search(ctx, text, limit)
	if err != nil {
		spanErr(span, err)
		return nil, runner.Failed(err, "search: %v", err)
	}
	span.SetAttributes(attribute.Int("planex.search.hits", len(out.Hits)), attribute.Int64("planex.search.total", int64(out.Total)))
	return out, nil
}

// newIndexTool is search.index.
func newIndexTool(p *Pool, b *runner.SchemaBuilder) runner.Tool {
	return runner.NewTool(&planexv1.ToolSpec{
		Name:        "search.index",
		Pool:        "search",
		Description: "Adds documents to the search index, replacing those with the same id. Returns {indexed}.",
		ArgsSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"documents": map[string]any{
					"type": "array", "minItems": 1, "maxItems": MaxBatch,
					"items": map[string]any{
						"type": "object",
						"properties": map[string]any{
							"id":    map[string]any{"type": "string", "minLength": 1, "maxLength": 200},
							"title": map[string]any{"type": "string", "maxLength": 500},
							"body":  map[string]any{"type": "string"},
							"tags":  map[string]any{"type": "array", "maxItems": 50, "items": map[string]any{"type": "string", "minLength": 1, "maxLength": 100}},
						},
						"required":             []any{"id", "title", "body"},
						"additionalProperties": false,
					},
				},
			},
			"required":             []any{"documents"},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type":       "object",
			"properties": map[string]any{"indexed": map[string]any{"type": "integer"}},
		}),
		SideEffect:     planexv1.SideEffect_SIDE_EFFECT_WRITE,
		DefaultTimeout: durationpb.New(60 * time.Second),
		Idempotent:     true,
		Version:        Version,
	}, p.runIndex)
}

func (p *Pool) runIndex(ctx context.Context, c runner.Call) (any, error) {
	list := c.Args.GetFields()["documents"].GetListValue().GetValues()
	docs := make([]Document, 0, len(list))
	for i, v := range list {
		f := v.GetStructValue().GetFields()
		d := Document{ID: strings.TrimSpace(f["id"].GetStringValue()), Title: f["title"].GetStringValue(), Body: f["body"].GetStringValue()}
		if d.ID == "" {
			return nil, runner.InvalidArgument(fmt.Sprintf("args.documents[%d].id", i), "must not be blank")
		}
		for _, tag := range f["tags"].GetListValue().GetValues() {
			d.Tags = append(d.Tags, tag.GetStringValue())
		}
		docs = append(docs, d)
	}
	ctx, span := p.tracer.Start(ctx, "search index", trace.WithAttributes(attribute.Int("planex.search.documents", len(docs))))
	defer span.End()
	n, err := p.Index(ctx, docs)
	if err != nil {
		spanErr(span, err)
		return nil, runner.Failed(err, "index %d documents: %v", len(docs), err)
	}
	return map[string]any{"indexed": n}, nil
}
