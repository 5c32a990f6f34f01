package cassette

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// CatalogFile is the tool catalog a recording keeps next to its
// interactions: a replay registers exactly these tools.
const CatalogFile = "tools.json"

// Tools reads the cassette's tool catalog (CatalogFile), saying how to
// record one when it is missing.
func (c *Cassette) Tools() ([]*planexv1.ToolSpec, error) {
	f, err := os.Open(filepath.Join(c.dir, CatalogFile))
	if err != nil {
		return nil, fmt.Errorf("cassette %s: %w (record one with planex eval --dev --record %s, or planex dev --record %s)", c.dir, err, c.dir, c.dir)
	}
	defer f.Close()
	specs, err := ReadTools(f)
	if err != nil {
		return nil, fmt.Errorf("cassette %s: %w", c.dir, err)
	}
	return specs, nil
}

// WriteCatalog stores the tool catalog in the cassette's directory.
func (c *Cassette) WriteCatalog(specs []*planexv1.ToolSpec) error {
	f, err := os.Create(filepath.Join(c.dir, CatalogFile))
	if err != nil {
		return fmt.Errorf("cassette: %w", err)
	}
	if err := WriteTools(f, specs); err != nil {
		f.Close()
		return fmt.Errorf("cassette %s: %w", c.dir, err)
	}
	return f.Close()
}

// ReadTools decodes a tool catalog file: a JSON array of ToolSpecs
// (protojson), as `planex tools list --json` prints them or WriteTools
// writes.
func ReadTools(r io.Reader) ([]*planexv1.ToolSpec, error) {
	var raw []json.RawMessage
	if err := json.NewDecoder(r).Decode(&raw); err != nil {
		return nil, fmt.Errorf("read tool catalog: %w", err)
	}
	out := make([]*planexv1.ToolSpec, 0, len(raw))
	for i, m := range raw {
		s := &planexv1.ToolSpec{}
		if err := protojson.Unmarshal(m, s); err != nil {
			return nil, fmt.Errorf("read tool catalog: tool %d: %w", i, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// WriteTools encodes a catalog for ReadTools, sorted by name.
func WriteTools(w io.Writer, specs []*planexv1.ToolSpec) error {
	specs = slices.Clone(specs)
	slices.SortFunc(specs, func(a, b *planexv1.ToolSpec) int { return strings.Compare(a.GetName(), b.GetName()) })
	raw := make([]json.RawMessage, len(specs))
	for i, s := range specs {
		b, err := protojson.Marshal(s)
		if err != nil {
			return fmt.Errorf("encode tool %s: %w", s.GetName(), err)
		}
		raw[i] = b
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(raw)
}
