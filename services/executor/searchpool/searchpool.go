// Package searchpool is the "search" executor pool: search.query and
// search.index over a bleve index on disk (github.com/blevesearch/bleve/v2).
//
// Documents have an id, a title, a body and tags. Titles and bodies are
// analysed as English text (stemmed, stop words dropped); tags are matched
// whole. A query matches titles (boosted), bodies and tags; hits come back
// ranked by score with a snippet of the body in which the matched terms are
// marked **like this**.
//
// bleve keeps an exclusive lock on the index directory: one process (one
// replica) opens it at a time.
package searchpool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"strings"
	"unicode"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/analysis/analyzer/keyword"
	"github.com/blevesearch/bleve/v2/analysis/lang/en"
	"github.com/blevesearch/bleve/v2/mapping"
	"github.com/blevesearch/bleve/v2/search/query"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/planex-dev/planex/services/executor/runner"
)

const instrumentation = "github.com/planex-dev/planex/services/executor/searchpool"

// Limits of the tools' arguments.
const (
	DefaultLimit     = 10
	MaxLimit         = 50
	MaxBatch         = 500
	MaxQueryBytes    = 1000
	maxSnippetRunes  = 240
	fragmentMarkOpen = "<mark>"
)

// Document is one searchable document.
type Document struct {
	// ID is unique; indexing a document with an existing id replaces it.
	ID string `json:"id"`
	// Title is shown in hits and weighs more than the body.
	Title string `json:"title"`
	// Body is the text (markdown is fine).
	Body string `json:"body"`
	// Tags are matched whole ("billing").
	Tags []string `json:"tags,omitempty"`
}

// Config configures the pool.
type Config struct {
	// IndexDir is the index directory; created when missing.
	IndexDir string
	// Logger receives the pool's logs.
	Logger *slog.Logger
}

// Pool is an open search index.
type Pool struct {
	idx    bleve.Index
	tracer trace.Tracer
	logger *slog.Logger
	tools  []runner.Tool
}

// indexMapping is the mapping of a new index.
func indexMapping() mapping.IndexMapping {
	text := func() *mapping.FieldMapping {
		f := bleve.NewTextFieldMapping()
		f.Analyzer = en.AnalyzerName
		f.Store = true
		f.IncludeTermVectors = true
		return f
	}
	kw := func() *mapping.FieldMapping {
		f := bleve.NewKeywordFieldMapping()
		f.Analyzer = keyword.Name
		f.Store = true
		return f
	}
	doc := bleve.NewDocumentMapping()
	doc.AddFieldMappingsAt("id", kw())
	doc.AddFieldMappingsAt("title", text())
	doc.AddFieldMappingsAt("body", text())
	doc.AddFieldMappingsAt("tags", kw())
	m := bleve.NewIndexMapping()
	m.DefaultMapping = doc
	m.DefaultAnalyzer = en.AnalyzerName
	return m
}

// openIndex opens the index in dir or creates it.
func openIndex(dir string) (bleve.Index, error) {
	if dir == "" {
		return nil, errors.New("--search-index: required for the search pool")
	}
	idx, err := bleve.Open(dir)
	if errors.Is(err, bleve.ErrorIndexPathDoesNotExist) {
		idx, err = bleve.New(dir, indexMapping())
	}
	if err != nil {
		return nil, fmt.Errorf("open search index %s: %w", dir, err)
	}
	return idx, nil
}

// Open opens (or creates) the index in cfg.IndexDir.
func Open(cfg Config) (*Pool, error) {
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	idx, err := openIndex(cfg.IndexDir)
	if err != nil {
		return nil, err
	}
	p := &Pool{idx: idx, tracer: otel.Tracer(instrumentation), logger: cfg.Logger}
	var b runner.SchemaBuilder
	p.tools = []runner.Tool{newQueryTool(p, &b), newIndexTool(p, &b)}
	if b.Err != nil {
		return nil, errors.Join(b.Err, idx.Close())
	}
	return p, nil
}

// Close closes the index.
func (p *Pool) Close() error { return p.idx.Close() }

// Tools returns search.query and search.index.
func (p *Pool) Tools() []runner.Tool { return p.tools }

// Index adds or replaces docs in one batch and returns how many it indexed.
func (p *Pool) Index(ctx context.Context, docs []Document) (int, error) {
	return indexBatch(ctx, p.idx, docs)
}

// IndexDocuments opens (or creates) the index in dir, adds or replaces
// docs and closes it; `planex dev` uses it to load the demo corpus before
// the search pool starts.
func IndexDocuments(ctx context.Context, dir string, docs []Document) (_ int, err error) {
	idx, err := openIndex(dir)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, idx.Close()) }()
	return indexBatch(ctx, idx, docs)
}

func indexBatch(ctx context.Context, idx bleve.Index, docs []Document) (int, error) {
	b := idx.NewBatch()
	for i, d := range docs {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if strings.TrimSpace(d.ID) == "" {
			return 0, fmt.Errorf("document %d: empty id", i)
		}
		tags := make([]string, 0, len(d.Tags))
		for _, t := range d.Tags {
			tags = append(tags, strings.ToLower(strings.TrimSpace(t)))
		}
		if err := b.Index(d.ID, map[string]any{"id": d.ID, "title": d.Title, "body": d.Body, "tags": tags}); err != nil {
			return 0, fmt.Errorf("index document %q: %w", d.ID, err)
		}
	}
	if err := idx.Batch(b); err != nil {
		return 0, fmt.Errorf("write index batch of %d documents: %w", len(docs), err)
	}
	return len(docs), nil
}

// Hit is one ranked search result.
type Hit struct {
	// ID of the document.
	ID string `json:"id"`
	// Title of the document.
	Title string `json:"title"`
	// Snippet is an excerpt of the body with the matched terms in **bold**.
	Snippet string `json:"snippet"`
	// Score is bleve's relevance score; higher is better.
	Score float64 `json:"score"`
}

// QueryOutput is the output of search.query.
type QueryOutput struct {
	// Hits, best first.
	Hits []Hit `json:"hits"`
	// Total is the number of matching documents (hits holds at most limit).
	Total uint64 `json:"total"`
	// Truncated is set when hits were cut to the output size cap.
	Truncated bool `json:"truncated,omitempty"`
}

// Len implements runner.Truncatable.
func (q *QueryOutput) Len() int { return len(q.Hits) }

// Cut implements runner.Truncatable.
func (q *QueryOutput) Cut(n int) any {
	return &QueryOutput{Hits: q.Hits[:n], Total: q.Total, Truncated: true}
}

// search runs a free-text query.
func (p *Pool) search(ctx context.Context, text string, limit int) (*QueryOutput, error) {
	var disjuncts []query.Query
	title := bleve.NewMatchQuery(text)
	title.SetField("title")
	title.SetBoost(3)
	body := bleve.NewMatchQuery(text)
	body.SetField("body")
	disjuncts = append(disjuncts, title, body)
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '-' }) {
		tag := bleve.NewTermQuery(w)
		tag.SetField("tags")
		tag.SetBoost(2)
		disjuncts = append(disjuncts, tag)
	}
	req := bleve.NewSearchRequestOptions(bleve.NewDisjunctionQuery(disjuncts...), limit, 0, false)
	req.Fields = []string{"title", "body"}
	req.Highlight = bleve.NewHighlightWithStyle("html")
	req.Highlight.AddField("body")
	res, err := p.idx.SearchInContext(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &QueryOutput{Hits: make([]Hit, 0, len(res.Hits)), Total: res.Total}
	for _, h := range res.Hits {
		title, _ := h.Fields["title"].(string)
		body, _ := h.Fields["body"].(string)
		out.Hits = append(out.Hits, Hit{ID: h.ID, Title: title, Snippet: snippet(h.Fragments["body"], body), Score: h.Score})
	}
	return out, nil
}

// snippet renders bleve's first HTML fragment as plain text with the
// matched terms in **bold**, or the start of the body when no fragment
// matched (a title or tag hit).
func snippet(fragments []string, body string) string {
	if len(fragments) > 0 && strings.Contains(fragments[0], fragmentMarkOpen) {
		s := strings.NewReplacer(fragmentMarkOpen, "**", "</mark>", "**").Replace(fragments[0])
		return strings.Join(strings.Fields(html.UnescapeString(s)), " ")
	}
	s := []rune(strings.Join(strings.Fields(body), " "))
	if len(s) > maxSnippetRunes {
		return string(s[:maxSnippetRunes]) + "…"
	}
	return string(s)
}

// spanErr marks span failed.
func spanErr(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
