package searchpool

import (
	"context"
	"fmt"
)

// Probe checks that the index answers (it reads its document count); the
// executor runs it periodically for its backend health.
func (p *Pool) Probe(context.Context) error {
	if _, err := p.idx.DocCount(); err != nil {
		return fmt.Errorf("search index: %w", err)
	}
	return nil
}
