// Package searchpool is the "search" executor pool: search.query,
// search.get and search.index over a bleve index on disk
// (github.com/blevesearch/bleve/v2).
//
// Documents have an id, a title, a body and tags. Titles and bodies are
// analysed as English text (stemmed, stop words dropped); tags are matched
// whole. A query matches titles (boosted), bodies and tags; hits come back
// ranked by score with a snippet of the body in which the matched terms are
// marked **like this**, and with their coverage: the share of the query's
// terms found in the document's title or tags.
//
// Retrieval is grounded by default (docs/adding-a-tool.md, "Grounded
// retrieval"): a document is a hit only when it is about every term of the
// query — each term occurs in its title or tags, and at least one in its
// title. A word that only appears somewhere in a body ("cleaning" in a
// security runbook), or one generic tag that many documents carry
// ("database"), does not make a document about a topic; such documents go
// to below, so that a caller can say what came closest. A caller that
// browses sets require_all_terms to false and gets them among the hits
// marked grounded: false. search.get refuses, within a run, a document
// that run's queries only found as a weak match, unless told it browses:
// a side effect is never fed a document that is not about its topic.
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
	"math"
	"slices"
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
	MaxBelow         = 3
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
	// matches remembers the weak matches of each run's queries.
	matches *matchLog
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
	p := &Pool{idx: idx, tracer: otel.Tracer(instrumentation), logger: cfg.Logger, matches: &matchLog{idx: idx, maxRuns: maxRecordedRuns}}
	var b runner.SchemaBuilder
	p.tools = []runner.Tool{newQueryTool(p, &b), newGetTool(p, &b), newIndexTool(p, &b)}
	if b.Err != nil {
		return nil, errors.Join(b.Err, idx.Close())
	}
	return p, nil
}

// Close closes the index.
func (p *Pool) Close() error { return p.idx.Close() }

// Tools returns search.query, search.get and search.index.
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
	// ID of the document; search.get returns the whole document.
	ID string `json:"id"`
	// Title of the document.
	Title string `json:"title"`
	// Snippet is an excerpt of the body with the matched terms in **bold**.
	Snippet string `json:"snippet"`
	// Score is bleve's relevance score; higher is better. It is relative
	// to the query and the corpus, not a probability.
	Score float64 `json:"score"`
	// Coverage is the share (0 to 1) of the query's terms, stemmed and
	// without stop words, that occur in the document's title or tags: 1
	// when the document is about every word of the query, 0 when the
	// words only occur in its body.
	Coverage float64 `json:"coverage"`
	// Grounded is set when the document is about the whole query: every
	// term occurs in its title or tags (Coverage 1) and at least one in
	// its title. Only grounded documents are hits unless the query
	// browses (require_all_terms false).
	Grounded bool `json:"grounded"`
	// Missing lists the query's words that occur in neither the title nor
	// the tags, as the query spelled them; empty when Coverage is 1.
	Missing []string `json:"missing,omitempty"`
}

// QueryOutput is the output of search.query.
type QueryOutput struct {
	// Hits, best first: the documents that match and pass min_score,
	// min_coverage and, unless the query browses, the grounding rule.
	Hits []Hit `json:"hits"`
	// Total is the number of matching documents before the thresholds
	// (hits holds at most limit).
	Total uint64 `json:"total"`
	// Below holds up to MaxBelow of the best matching documents that
	// the grounding rule, min_score or min_coverage rejected, best first,
	// so that a caller can say what came closest.
	Below []Hit `json:"below"`
	// RequireAllTerms echoes the query's require_all_terms: when true,
	// every hit is grounded.
	RequireAllTerms bool `json:"require_all_terms"`
	// Note says, when a browsing query returned hits that are not
	// grounded, that they are not about the topic and must not feed a
	// side effect.
	Note string `json:"note,omitempty"`
	// Truncated is set when hits were cut to the output size cap.
	Truncated bool `json:"truncated,omitempty"`
}

// Len implements runner.Truncatable.
func (q *QueryOutput) Len() int { return len(q.Hits) }

// Cut implements runner.Truncatable.
func (q *QueryOutput) Cut(n int) any {
	c := *q
	c.Hits, c.Truncated = q.Hits[:n], true
	return &c
}

// Query is one search.query request. The zero value of every threshold
// is the safe default: hits are grounded.
type Query struct {
	// Text is the free-text query.
	Text string
	// Limit caps the hits returned.
	Limit int
	// MinScore drops hits scoring below it.
	MinScore float64
	// MinCoverage drops hits whose Coverage is below it.
	MinCoverage float64
	// Browse returns documents that are not grounded among the hits too,
	// marked Grounded false (search.query's require_all_terms: false).
	Browse bool
}

// Search runs a free-text query.
func (p *Pool) Search(ctx context.Context, q Query) (*QueryOutput, error) {
	text := q.Text
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
	size := q.Limit
	if !q.Browse || q.MinScore > 0 || q.MinCoverage > 0 {
		// The grounding rule and the thresholds drop hits; look further
		// so that limit hits can pass.
		size = q.Limit + 2*MaxLimit
	}
	req := bleve.NewSearchRequestOptions(bleve.NewDisjunctionQuery(disjuncts...), size, 0, false)
	req.Fields = []string{"title", "body", "tags"}
	req.Highlight = bleve.NewHighlightWithStyle("html")
	req.Highlight.AddField("body")
	res, err := p.idx.SearchInContext(ctx, req)
	if err != nil {
		return nil, err
	}
	terms := p.analyze(text)
	out := &QueryOutput{Hits: make([]Hit, 0, min(len(res.Hits), q.Limit)), Below: []Hit{}, Total: res.Total, RequireAllTerms: !q.Browse}
	weak := 0
	for _, h := range res.Hits {
		title, _ := h.Fields["title"].(string)
		body, _ := h.Fields["body"].(string)
		hit := Hit{ID: h.ID, Title: title, Snippet: snippet(h.Fragments["body"], body), Score: h.Score}
		hit.Coverage, hit.Grounded, hit.Missing = p.ground(terms, title, fieldStrings(h.Fields["tags"]))
		switch {
		case hit.Score < q.MinScore || hit.Coverage < q.MinCoverage || (!q.Browse && !hit.Grounded):
			if len(out.Below) < MaxBelow {
				out.Below = append(out.Below, hit)
			}
		case len(out.Hits) < q.Limit:
			out.Hits = append(out.Hits, hit)
			if !hit.Grounded {
				weak++
			}
		}
	}
	if weak > 0 {
		out.Note = fmt.Sprintf("require_all_terms is false: %d of the hits (grounded: false) are not about every word of the query; "+
			"do not act on them (search.get refuses them in this run unless browse is true)", weak)
	}
	return out, nil
}

// term is one analysed term of a text and the word it came from.
type term struct {
	// Term is the term as the index holds it (stemmed, lower case).
	Term string
	// Word is the text's word it was analysed from.
	Word string
}

// analyze returns the distinct analysed terms of text, as the index sees
// them (stemmed, lower case, stop words dropped), in text order.
func (p *Pool) analyze(text string) []term {
	a := p.idx.Mapping().AnalyzerNamed(en.AnalyzerName)
	if a == nil {
		var out []term
		for _, w := range strings.Fields(strings.ToLower(text)) {
			out = append(out, term{Term: w, Word: w})
		}
		return out
	}
	var out []term
	for _, tok := range a.Analyze([]byte(text)) {
		t := string(tok.Term)
		if slices.ContainsFunc(out, func(o term) bool { return o.Term == t }) {
			continue
		}
		word := t
		if tok.Start >= 0 && tok.End <= len(text) && tok.Start < tok.End {
			word = text[tok.Start:tok.End]
		}
		out = append(out, term{Term: t, Word: word})
	}
	return out
}

// ground measures how much of the query's terms a document's title and
// tags hold: the coverage (0 to 1), whether the document is grounded
// (every term in the title or the tags, at least one in the title) and
// the words that are in neither.
func (p *Pool) ground(terms []term, title string, tags []string) (coverage float64, grounded bool, missing []string) {
	if len(terms) == 0 {
		return 0, false, nil
	}
	// "On-call" in a title also stands for "oncall".
	inTitle := termSet(append(p.analyze(title), p.analyze(strings.ReplaceAll(title, "-", ""))...))
	inTags := termSet(p.analyze(strings.Join(tags, " ")))
	n, anchored := 0, false
	for _, t := range terms {
		switch {
		case inTitle[t.Term]:
			n++
			anchored = true
		case inTags[t.Term]:
			n++
		default:
			missing = append(missing, t.Word)
		}
	}
	coverage = math.Round(float64(n)/float64(len(terms))*1000) / 1000
	return coverage, n == len(terms) && anchored, missing
}

// termSet is the set of the terms' Term.
func termSet(terms []term) map[string]bool {
	s := make(map[string]bool, len(terms))
	for _, t := range terms {
		s[t.Term] = true
	}
	return s
}

// fieldStrings reads a stored field that may hold one value or several.
func fieldStrings(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// ErrNotFound is returned, wrapped, by Get for an id the index does not
// hold.
var ErrNotFound = errors.New("no such document")

// Get returns the whole stored document with id, its body exactly as it
// was indexed.
func (p *Pool) Get(ctx context.Context, id string) (*Document, error) {
	req := bleve.NewSearchRequestOptions(bleve.NewDocIDQuery([]string{id}), 1, 0, false)
	req.Fields = []string{"title", "body", "tags"}
	res, err := p.idx.SearchInContext(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("get document %q: %w", id, err)
	}
	if len(res.Hits) == 0 {
		return nil, fmt.Errorf("document %q: %w", id, ErrNotFound)
	}
	h := res.Hits[0]
	title, _ := h.Fields["title"].(string)
	body, _ := h.Fields["body"].(string)
	return &Document{ID: h.ID, Title: title, Body: body, Tags: fieldStrings(h.Fields["tags"])}, nil
}

// snippet renders bleve's first HTML fragment as plain text with the
// matched terms in **bold**, or the start of the body when no fragment
// matched (a title or tag hit).
func snippet(fragments []string, body string) string {
	if len(fragments) > 0 && strings.Contains(fragments[0], fragmentMarkOpen) {
		s := strings.NewReplacer(fragmentMarkOpen, "**", "</mark>", "**").Replace(fragments[0])
		return wholeWords(strings.Join(strings.Fields(html.UnescapeString(s)), " "), body)
	}
	s := []rune(strings.Join(strings.Fields(body), " "))
	if len(s) > maxSnippetRunes {
		return string(s[:maxSnippetRunes]) + "…"
	}
	return string(s)
}

// wholeWords drops the partial words bleve's fragmenter leaves at the
// ends of a fragment ("…empt 1) fails" becomes "… 1) fails") and marks
// every cut with an ellipsis. s is the fragment with **marks**, body the
// document's text.
func wholeWords(s, body string) string {
	core := strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "…"), "…"))
	plain := strings.ReplaceAll(core, "**", "")
	norm := strings.Join(strings.Fields(body), " ")
	i := strings.Index(norm, plain)
	if i < 0 || plain == "" {
		return s
	}
	words := strings.Fields(core)
	cutStart, cutEnd := i > 0, i+len(plain) < len(norm)
	if cutStart && norm[i-1] != ' ' && len(words) > 1 {
		words = words[1:]
	}
	if cutEnd && norm[i+len(plain)] != ' ' && len(words) > 1 {
		words = words[:len(words)-1]
	}
	out := strings.Join(words, " ")
	if cutStart {
		out = "… " + out
	}
	if cutEnd {
		out += " …"
	}
	return out
}

// spanErr marks span failed.
func spanErr(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
