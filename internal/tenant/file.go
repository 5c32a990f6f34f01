package tenant

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// ParseFile parses a tenants file (--tenants-file): a YAML or JSON list of
// tenants in the protobuf JSON form of planex.v1.Tenant (camelCase or
// snake_case field names, durations as "3600s"). Every tenant is
// validated; errors name the entry and the field.
func ParseFile(data []byte) ([]*planexv1.Tenant, error) {
	var raw []any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("tenants file: want a YAML or JSON list of tenants: %w", err)
	}
	var out []*planexv1.Tenant
	var errs []error
	seen := map[string]int{}
	for i, v := range raw {
		durations(v)
		js, err := json.Marshal(jsonable(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("tenants file: entry %d: %w", i, err))
			continue
		}
		t := &planexv1.Tenant{}
		if err := protojson.Unmarshal(js, t); err != nil {
			errs = append(errs, fmt.Errorf("tenants file: entry %d: %w", i, err))
			continue
		}
		if err := Validate(t); err != nil {
			errs = append(errs, fmt.Errorf("tenants file: entry %d (%s): %w", i, t.GetName(), err))
			continue
		}
		if j, ok := seen[t.GetName()]; ok {
			errs = append(errs, fmt.Errorf("tenants file: entry %d: tenant.name %q: also entry %d", i, t.GetName(), j))
			continue
		}
		seen[t.GetName()] = i
		out = append(out, t)
	}
	return out, errors.Join(errs...)
}

// durations rewrites Go durations ("720h") of the duration fields
// (retention, budget.maxDuration) to protobuf JSON's seconds ("2592000s").
func durations(v any) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	conv := func(m map[string]any, keys ...string) {
		for _, k := range keys {
			if s, ok := m[k].(string); ok {
				if d, err := time.ParseDuration(s); err == nil {
					m[k] = strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
				}
			}
		}
	}
	conv(m, "retention")
	if b, ok := m["budget"].(map[string]any); ok {
		conv(b, "maxDuration", "max_duration")
	}
}

// jsonable turns YAML's decoded values into what encoding/json accepts
// (map[string]any keys; yaml.v3 already decodes string keys).
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = jsonable(e)
		}
		return x
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = jsonable(e)
		}
		return x
	}
	return v
}

// Apply makes the registry hold every tenant of the list: creates the
// missing ones and updates those whose spec differs. Tenants absent from
// the list are left alone (remove them with DeleteTenant): a file never
// deletes a team's data by omission.
func (r *Registry) Apply(ctx context.Context, tenants []*planexv1.Tenant) (created, updated int, err error) {
	for _, t := range tenants {
		cur, err := r.Get(ctx, t.GetName())
		switch {
		case errors.Is(err, ErrNotFound):
			if _, err := r.Create(ctx, t); err != nil && !errors.Is(err, ErrExists) {
				return created, updated, err
			}
			created++
		case err != nil:
			return created, updated, err
		case !proto.Equal(spec(cur), spec(t)):
			n := spec(t)
			n.Revision = cur.GetRevision()
			if _, err := r.Update(ctx, n); err != nil {
				return created, updated, err
			}
			updated++
		}
	}
	return created, updated, nil
}

// WatchFile applies path to the registry now and whenever its contents
// change (checked every interval), until ctx ends. A file that does not
// parse is logged and the registry kept as it is; the first error is
// returned, so that a supervisor started with a broken file refuses to
// start.
func (r *Registry) WatchFile(ctx context.Context, path string, interval time.Duration, logger *slog.Logger) (wait func() error, err error) {
	apply := func(data []byte) error {
		list, err := ParseFile(data)
		if err != nil {
			return fmt.Errorf("--tenants-file %s: %w", path, err)
		}
		c, u, err := r.Apply(ctx, list)
		if err != nil {
			return fmt.Errorf("--tenants-file %s: %w", path, err)
		}
		if c+u > 0 {
			logger.InfoContext(ctx, "applied the tenants file", "file", path, "created", c, "updated", u)
		}
		return nil
	}
	last, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tenants-file: %w", err)
	}
	if err := apply(last); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			data, err := os.ReadFile(path)
			if err != nil || bytes.Equal(data, last) {
				continue
			}
			if err := apply(data); err != nil {
				logger.ErrorContext(ctx, "tenants file not applied; the registry keeps its tenants", "error", err)
				continue
			}
			last = data
		}
	}()
	return func() error { <-done; return nil }, nil
}
