package playbook

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
)

// Source is one place playbooks are loaded from.
type Source struct {
	// FS holds the playbook files: every *.yaml and *.yml file, searched
	// recursively, in lexical order.
	FS fs.FS
	// Name prefixes file names in errors and in Playbook.Source: a
	// directory path, or a label such as "builtin".
	Name string
}

// Dir is a Source reading the directory dir of the local file system.
func Dir(dir string) Source { return Source{FS: os.DirFS(dir), Name: dir} }

// Set is a loaded and checked set of playbooks. It is the playbook planner
// backend; it is immutable and safe for concurrent use.
type Set struct {
	books []*Playbook
}

// Load reads, parses and checks the playbooks of every source. It returns
// one error listing every problem found, each as "file:line: reason". A
// playbook name must be unique within a source; across sources the first
// source wins, so a directory listed before the built-in playbooks can
// override one of them. Load returns an empty set when the sources hold no
// playbook files.
func Load(srcs ...Source) (*Set, error) {
	s := &Set{}
	var errs []error
	taken := map[string]bool{}
	for _, src := range srcs {
		books, err := loadSource(src)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		local := map[string]*Playbook{}
		for _, b := range books {
			if first := local[b.Name]; first != nil {
				errs = append(errs, fmt.Errorf("%s: duplicate playbook name %q (first defined at %s)", b.Source, b.Name, first.Source))
				continue
			}
			local[b.Name] = b
			if taken[b.Name] {
				continue // overridden by an earlier source
			}
			taken[b.Name] = true
			s.books = append(s.books, b)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("load playbooks: %w", err)
	}
	return s, nil
}

func loadSource(src Source) ([]*Playbook, error) {
	if src.FS == nil {
		return nil, fmt.Errorf("playbooks %s: no file system", src.Name)
	}
	var files []string
	err := fs.WalkDir(src.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Hidden directories are skipped: a Kubernetes ConfigMap volume
		// keeps each file twice, under ..<timestamp>/ and as a symlink.
		if d.IsDir() && p != "." && strings.HasPrefix(d.Name(), ".") {
			return fs.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("playbooks %s: %w", src.Name, err)
	}
	var books []*Playbook
	var errs []error
	for _, name := range files {
		label := name
		if src.Name != "" {
			label = path.Join(src.Name, name)
		}
		got, err := readFile(src.FS, name, label)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		books = append(books, got...)
	}
	return books, errors.Join(errs...)
}

func readFile(fsys fs.FS, name, label string) ([]*Playbook, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	defer f.Close()
	books, err := parseFile(label, f)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, b := range books {
		errs = append(errs, b.check())
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return books, nil
}

// Playbooks returns the loaded playbooks in matching order.
func (s *Set) Playbooks() []*Playbook { return slices.Clone(s.books) }

// Len is the number of loaded playbooks.
func (s *Set) Len() int { return len(s.books) }

// anyTool is a catalog that knows every tool and accepts any arguments; it
// lets Load check a playbook's structure and expressions without the
// executors' catalog, which is checked for each request instead.
type anyTool struct{}

func (anyTool) Tool(name string) (*planexv1.ToolSpec, bool) {
	return &planexv1.ToolSpec{Name: name}, true
}

// check validates what parsing cannot: step references, expressions,
// branch conditions and examples.
func (b *Playbook) check() error {
	f := &file{name: b.file}
	sample := make(map[string]any, len(b.params))
	for name, p := range b.params {
		sample[name] = p.zero()
	}
	f.checkVariant(b, &b.main, nil, sample)
	ids := map[string]bool{}
	for _, s := range b.main.steps {
		ids[s.id] = true
	}
	for _, br := range b.branches {
		for _, s := range br.steps {
			ids[s.id] = true
		}
	}
	for i, br := range b.branches {
		for _, st := range br.when.steps {
			if !ids[st] {
				f.errorf(br.line, "on_failure[%d].when.step: unknown step %q", i, st)
			}
		}
		if br.fail != "" {
			if expr, err := inlineParams(br.fail, sample); err != nil {
				f.errorf(br.failLine, "on_failure[%d].fail: %v", i, err)
			} else if _, err := compileFail(expr); err != nil {
				f.errorf(br.failLine, "on_failure[%d].fail: %v", i, err)
			}
			continue
		}
		f.checkVariant(b, &br.variant, br, sample)
	}
	for _, ex := range b.Examples {
		if _, err := b.bind(normalizeGoal(ex), nil); err != nil {
			f.errorf(b.line, "playbook %s: example %q does not match: %v", b.Name, ex, err)
		}
	}
	return f.err()
}

// checkVariant builds the plan a variant produces with stand-in parameter
// values and validates it; a branch is checked as if every main step had
// completed, the most it can rely on.
func (f *file) checkVariant(b *Playbook, v *variant, br *branch, sample map[string]any) {
	steps := v.steps
	answer, answerLine := v.answer, v.answerLine
	if br != nil {
		redefined := map[string]bool{}
		for _, s := range br.steps {
			redefined[s.id] = true
		}
		steps = slices.Clone(br.steps)
		for _, s := range b.main.steps {
			if !redefined[s.id] {
				steps = append(steps, s)
			}
		}
		if answer == "" {
			answer, answerLine = b.main.answer, b.main.answerLine
		}
	}
	defs := map[string]*stepDef{}
	p := &planexv1.Plan{Revision: 1, Confidence: b.confidence}
	for _, s := range steps {
		defs[s.id] = s
		st, err := s.build(sample)
		if err != nil {
			f.errorf(s.line, "step %q: %v", s.id, err)
			continue
		}
		p.Steps = append(p.Steps, st)
	}
	a, err := inlineParams(answer, sample)
	if err != nil {
		f.errorf(answerLine, "answer: %v", err)
	}
	p.Answer = a
	err = plan.Validate(p, anyTool{}, plan.DefaultLimits())
	var ve *plan.ValidationError
	if !errors.As(err, &ve) {
		return
	}
	for _, pr := range ve.Problems {
		var line int
		switch d := defs[pr.Step]; {
		case pr.Field == "answer":
			line = answerLine
		case d != nil && pr.Field == "expect" && d.expectLine > 0:
			line = d.expectLine
		case d != nil:
			line = d.line
		case br != nil:
			line = br.line
		default:
			line = b.line
		}
		f.errorf(line, "%s", pr.String())
	}
}
