package demo

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// Doc is one demo document: a runbook or a policy of the demo company, as
// the search pool indexes it.
type Doc struct {
	// ID is unique, kebab-case and stable across releases, e.g.
	// "runbook-failed-payment-retries".
	ID string
	// Title is the human title, e.g. "Runbook: Failed payment retries".
	Title string
	// Body is the document's markdown, without the title.
	Body string
	// Tags are lowercase topic words such as "billing" or "oncall".
	Tags []string
}

// runbookFS holds one markdown file per Doc, named <ID>.md. Each starts with
// a front matter block:
//
//	---
//	title: Runbook: Failed payment retries
//	tags: billing, payments, finance
//	---
//
// and the rest of the file is the body.
//
//go:embed runbooks/*.md
var runbookFS embed.FS

// Runbooks returns the demo company's runbooks and policies, about fifty of
// them, ordered by ID. Every call returns the same documents in a fresh
// slice the caller may modify.
//
// The documents are embedded in the binary and checked by this package's
// tests; Runbooks panics only if an embedded file is malformed, which is a
// build defect, not a runtime condition.
func Runbooks() []Doc {
	docs, err := loadRunbooks(runbookFS)
	if err != nil {
		panic("demo: " + err.Error())
	}
	return docs
}

// loadRunbooks parses every runbooks/*.md file of fsys, in name order.
func loadRunbooks(fsys fs.FS) ([]Doc, error) {
	names, err := fs.Glob(fsys, "runbooks/*.md")
	if err != nil {
		return nil, err
	}
	docs := make([]Doc, 0, len(names))
	for _, name := range names {
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		doc, err := parseDoc(strings.TrimSuffix(path.Base(name), ".md"), string(data))
		if err != nil {
			return nil, fmt.Errorf("runbook %s: %w", name, err)
		}
		docs = append(docs, doc)
	}
	return docs, nil
}

// parseDoc splits a runbook file into front matter and body.
func parseDoc(id, text string) (Doc, error) {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	rest, ok := strings.CutPrefix(text, "---\n")
	if !ok {
		return Doc{}, fmt.Errorf("no front matter")
	}
	header, body, ok := strings.Cut(rest, "\n---\n")
	if !ok {
		return Doc{}, fmt.Errorf("front matter not closed by ---")
	}
	doc := Doc{ID: id, Body: strings.TrimSpace(body) + "\n"}
	for line := range strings.Lines(header) {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			return Doc{}, fmt.Errorf("front matter line %q is not key: value", strings.TrimSpace(line))
		}
		value = strings.TrimSpace(value)
		switch strings.TrimSpace(key) {
		case "title":
			doc.Title = value
		case "tags":
			for tag := range strings.SplitSeq(value, ",") {
				if tag = strings.TrimSpace(tag); tag != "" {
					doc.Tags = append(doc.Tags, tag)
				}
			}
		default:
			return Doc{}, fmt.Errorf("unknown front matter key %q", key)
		}
	}
	if doc.Title == "" {
		return Doc{}, fmt.Errorf("front matter has no title")
	}
	return doc, nil
}
