package searchpool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

// Version is reported in the tool specs.
const Version = "1"

// newQueryTool is search.query.
func newQueryTool(p *Pool, b *runner.SchemaBuilder) runner.Tool {
	hit := map[string]any{"type": "object", "properties": map[string]any{
		"id": map[string]any{"type": "string"}, "title": map[string]any{"type": "string"},
		"snippet": map[string]any{"type": "string"}, "score": map[string]any{"type": "number"},
		"coverage": map[string]any{"type": "number", "minimum": 0, "maximum": 1},
		"grounded": map[string]any{"type": "boolean"},
		"missing":  map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
	}}
	return runner.NewTool(&planexv1.ToolSpec{
		Name: "search.query",
		Pool: "search",
		Description: "Full-text search over the runbooks and policies index. Returns {hits: [{id, title, snippet, score, coverage, grounded, missing}], total, below}, best first; " +
			"matched terms are **bold** in snippets. Hits are grounded: a document is a hit only when every word of the query (stemmed, stop words dropped) " +
			"occurs in its title or tags and at least one in its title, so hits[0] is safe to act on; below lists the best rejected documents with the words they miss " +
			"(say \"no document about X; closest: ...\" instead of using them). coverage (0 to 1) is the share of the query's words in the title or tags. " +
			"Only to browse, set require_all_terms: false: hits then include documents marked grounded: false, which must not feed a side effect " +
			"(search.get refuses them in the run unless browse is true). Use the topic's own words (\"failed payment retries\"); fetch a whole document with search.get.",
		ArgsSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"query":        map[string]any{"type": "string", "minLength": 1, "maxLength": MaxQueryBytes},
				"limit":        map[string]any{"type": "integer", "minimum": 1, "maximum": MaxLimit, "description": fmt.Sprintf("hits to return, default %d", DefaultLimit)},
				"min_score":    map[string]any{"type": "number", "minimum": 0, "description": "drop hits whose score is lower, default 0"},
				"min_coverage": map[string]any{"type": "number", "minimum": 0, "maximum": 1, "description": "drop hits whose coverage is lower, default 0"},
				"require_all_terms": map[string]any{"type": "boolean", "description": "default true: only grounded documents (every query word in the title or tags, one in the title) are hits; " +
					"false browses, returning weaker matches marked grounded: false that must not feed a side effect"},
			},
			"required":             []any{"query"},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"hits":              map[string]any{"type": "array", "items": hit},
				"total":             map[string]any{"type": "integer"},
				"below":             map[string]any{"type": "array", "items": hit, "maxItems": MaxBelow},
				"require_all_terms": map[string]any{"type": "boolean"},
				"note":              map[string]any{"type": "string"},
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
	minScore, terr := numberArg(c.Args, "min_score", 0, math.MaxFloat64)
	if terr != nil {
		return nil, terr
	}
	minCoverage, terr := numberArg(c.Args, "min_coverage", 0, 1)
	if terr != nil {
		return nil, terr
	}
	requireAll, terr := boolArg(c.Args, "require_all_terms", true)
	if terr != nil {
		return nil, terr
	}
	ctx, span := p.tracer.Start(ctx, "search query", trace.WithAttributes(
		attribute.Int("planex.search.query_length", len(text)), attribute.Int("planex.search.limit", limit),
		attribute.Float64("planex.search.min_score", minScore), attribute.Float64("planex.search.min_coverage", minCoverage),
		attribute.Bool("planex.search.require_all_terms", requireAll)))
	defer span.End()
	out, err := p.Search(ctx, Query{Text: text, Limit: limit, MinScore: minScore, MinCoverage: minCoverage, Browse: !requireAll})
	if err != nil {
		spanErr(span, err)
		return nil, runner.Failed(err, "search: %v", err)
	}
	// Without the record, a later search.get of a weak match could not be
	// refused: no record, no answer.
	if err := p.matches.record(c.RunID, text, out); err != nil {
		spanErr(span, err)
		return nil, runner.Failed(err, "search: record the matches of run %s: %v", c.RunID, err)
	}
	grounded := 0
	for _, h := range out.Hits {
		if h.Grounded {
			grounded++
		}
	}
	span.SetAttributes(attribute.Int("planex.search.hits", len(out.Hits)), attribute.Int("planex.search.grounded", grounded),
		attribute.Int64("planex.search.total", int64(out.Total)))
	return out, nil
}

// boolArg reads the optional boolean argument name, def when absent.
func boolArg(args *structpb.Struct, name string, def bool) (bool, *runner.Error) {
	v, ok := args.GetFields()[name]
	if !ok {
		return def, nil
	}
	b, isBool := v.GetKind().(*structpb.Value_BoolValue)
	if !isBool {
		return false, runner.InvalidArgument("args."+name, "want true or false")
	}
	return b.BoolValue, nil
}

// numberArg reads the optional number argument name, 0 when absent, and
// checks that it lies between lo and hi.
func numberArg(args *structpb.Struct, name string, lo, hi float64) (float64, *runner.Error) {
	v, ok := args.GetFields()[name]
	if !ok {
		return 0, nil
	}
	num, isNum := v.GetKind().(*structpb.Value_NumberValue)
	if !isNum || num.NumberValue < lo || num.NumberValue > hi || math.IsNaN(num.NumberValue) {
		if hi == math.MaxFloat64 {
			return 0, runner.InvalidArgument("args."+name, "want a number of at least %v", lo)
		}
		return 0, runner.InvalidArgument("args."+name, "want a number from %v to %v", lo, hi)
	}
	return num.NumberValue, nil
}

// newGetTool is search.get.
func newGetTool(p *Pool, b *runner.SchemaBuilder) runner.Tool {
	return runner.NewTool(&planexv1.ToolSpec{
		Name: "search.get",
		Pool: "search",
		Description: "Returns one whole document of the index by id (an id from search.query's hits): {id, title, body, tags}. " +
			"The body is the document's text exactly as indexed (markdown, tables and lists intact). Fails with INVALID_ARGUMENT when no document has the id, " +
			"and when this run's search.query calls found the document only as a weak match (in below, or a hit with grounded: false) and never as a grounded hit: " +
			"a document that is not about the topic must not feed a side effect. Set browse: true only to show such a document to a person.",
		ArgsSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"id":     map[string]any{"type": "string", "minLength": 1, "maxLength": 200},
				"browse": map[string]any{"type": "boolean", "description": "default false: true reads a document this run's queries only found as a weak match; never feed it to a side effect"},
			},
			"required":             []any{"id"},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"id":    map[string]any{"type": "string"},
				"title": map[string]any{"type": "string"},
				"body":  map[string]any{"type": "string"},
				"tags":  map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
			},
		}),
		SideEffect:     planexv1.SideEffect_SIDE_EFFECT_READ,
		DefaultTimeout: durationpb.New(10 * time.Second),
		Idempotent:     true,
		Version:        Version,
	}, p.runGet)
}

func (p *Pool) runGet(ctx context.Context, c runner.Call) (any, error) {
	id := strings.TrimSpace(c.Args.GetFields()["id"].GetStringValue())
	if id == "" {
		return nil, runner.InvalidArgument("args.id", "must not be blank")
	}
	browse, terr := boolArg(c.Args, "browse", false)
	if terr != nil {
		return nil, terr
	}
	ctx, span := p.tracer.Start(ctx, "search get", trace.WithAttributes(attribute.Bool("planex.search.browse", browse)))
	defer span.End()
	if !browse {
		w, weak, err := p.matches.weakOnly(c.RunID, id)
		if err != nil {
			spanErr(span, err)
			return nil, runner.Failed(err, "get document %q: %v", id, err)
		}
		if weak {
			span.SetAttributes(attribute.Bool("planex.search.weak_match", true))
			return nil, runner.InvalidArgument("args.id", "document %q is not about %q: this run's search found it only as a weak match (%s); "+
				"fetch a grounded hit, or set browse: true to show it to a person without acting on it", id, w.Query, w.Reason)
		}
	}
	doc, err := p.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil, runner.InvalidArgument("args.id", "no document with id %q in the index", id)
	}
	if err != nil {
		spanErr(span, err)
		return nil, runner.Failed(err, "get document %q: %v", id, err)
	}
	if doc.Tags == nil {
		doc.Tags = []string{}
	}
	return doc, nil
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
