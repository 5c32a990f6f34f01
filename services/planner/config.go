package planner

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/services/planner/anthropic"
	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/openai"
	"github.com/planex-dev/planex/services/planner/playbook"
)

// Backend names.
const (
	BackendPlaybook  = playbook.BackendName
	BackendOpenAI    = "openai"
	BackendAnthropic = "anthropic"
)

// BuiltinDemoPlaybooks, given to --playbooks, loads the demo playbooks
// built into the binary (the ones `planex dev` serves).
const BuiltinDemoPlaybooks = "builtin:demo"

// Provider defaults.
const (
	// DefaultOpenAIBaseURL is OpenAI's API.
	DefaultOpenAIBaseURL = "https://api.openai.com/v1"
	// DefaultOpenAIModel is the default --openai-model.
	DefaultOpenAIModel = "gpt-4.1-mini"
	// DefaultAnthropicBaseURL is Anthropic's API (the SDK appends
	// /v1/messages).
	DefaultAnthropicBaseURL = "https://api.anthropic.com"
	// DefaultAnthropicModel is the default --anthropic-model.
	DefaultAnthropicModel = "claude-sonnet-4-5"
)

// DefaultRetryBudget is the default --planner-retry-budget: below the
// supervisor's default --planner-timeout of 2m, so a provider that keeps
// failing ends the planner call with the provider's error, not the
// supervisor's timeout.
const DefaultRetryBudget = 90 * time.Second

// MaxAnthropicTemperature is the highest temperature the Anthropic API
// accepts (OpenAI's is 2).
const MaxAnthropicTemperature = 1.0

// Plan cache modes.
const (
	CacheOff     = "off"
	CacheExample = "example"
	CacheReuse   = "reuse"
)

// ProviderConfig configures one model provider.
type ProviderConfig struct {
	// BaseURL of the provider's API.
	BaseURL string
	// Model to ask.
	Model string
	// APIKeyFile holds the API key; when empty the key comes from the
	// provider's environment variable (OPENAI_API_KEY, ANTHROPIC_API_KEY).
	APIKeyFile string
}

// BackendConfig selects and configures the planner backends. It is shared
// by `planex planner` and the in-process planner of `planex dev`, which
// registers the same flags. It never holds an API key, only where to find
// one.
type BackendConfig struct {
	// Backend answers requests that do not name one: playbook, openai or
	// anthropic.
	Backend string
	// Playbooks are directories of playbook YAML files. They come before
	// BuiltinPlaybooks, so a playbook here overrides a built-in one with
	// the same name.
	Playbooks []string
	// BuiltinPlaybooks, when set, adds the playbooks of a file system (for
	// example playbook.DemoFS for `planex dev`). Not a flag.
	BuiltinPlaybooks fs.FS
	// AllowOverride lets a request pick another configured backend with
	// PlanRequest.backend.
	AllowOverride bool
	// OpenAI configures the openai backend (any OpenAI-compatible server).
	OpenAI ProviderConfig
	// Anthropic configures the anthropic backend.
	Anthropic ProviderConfig
	// MaxRetries of one model call on 408/409/429/5xx and connection errors.
	MaxRetries int
	// CallTimeout bounds each attempt of a model call.
	CallTimeout time.Duration
	// RetryBudget bounds all attempts of one model call and the waits
	// between them (DefaultRetryBudget when 0); it must fit inside the
	// supervisor's --planner-timeout (the planner also stops retrying
	// before the caller's deadline).
	RetryBudget time.Duration
	// MaxRetryAfter is the longest Retry-After honoured; a provider asking
	// for more fails the call at once, saying so.
	MaxRetryAfter time.Duration
	// Temperature of the model; negative leaves the provider's default.
	Temperature float64
	// MaxOutputTokens caps each model answer.
	MaxOutputTokens int
	// PlanCache is off, example (offer a cached plan to the model as an
	// example) or reuse (return a cached plan for the same goal and catalog
	// without asking the model).
	PlanCache string
	// PlanCacheTTL is how long a cached plan is kept.
	PlanCacheTTL time.Duration
	// EscalationBackend, when set (openai or anthropic), is asked again
	// with EscalationModel when the first answer's confidence is below
	// EscalationThreshold or it stayed invalid after the repair round.
	EscalationBackend string
	// EscalationModel is the stronger model of EscalationBackend.
	EscalationModel string
	// EscalationThreshold is the confidence below which to escalate.
	EscalationThreshold float64
	// Replay is the cassette directory the replay backend answers from
	// (`planex eval --dev --record DIR` or `planex dev --record DIR`).
	Replay string
	// ReplayMiss is what the replay backend does with a request the
	// cassette has no answer for: error (or empty: fail naming the
	// request) or live (ask ReplayLiveBackend).
	ReplayMiss string
	// ReplayLiveBackend answers the misses of --replay-miss live:
	// playbook, openai or anthropic, configured by their usual flags.
	ReplayLiveBackend string
	// Record is a cassette directory every backend's answers are recorded
	// into (`planex planner --record DIR`), keyed and redacted as
	// `planex dev --record` records them.
	Record string
	// Wrap, when set, wraps every backend built (not a flag): `planex
	// eval` records, replays or injects faults this way (replay.go).
	Wrap func(Backend) Backend
}

// RegisterFlags adds the backend flags to fs.
func (c *BackendConfig) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Backend, "planner-backend", BackendPlaybook, "planner backend: playbook, openai, anthropic, or replay (answers from the cassette in --replay)")
	fs.StringSliceVar(&c.Playbooks, "playbooks", nil, "directory of playbook YAML files, or "+BuiltinDemoPlaybooks+" for the demo playbooks built in (repeat the flag or separate with commas)")
	fs.BoolVar(&c.AllowOverride, "planner-allow-backend-override", false, "let a plan request choose another configured backend")
	fs.StringVar(&c.OpenAI.BaseURL, "openai-base-url", DefaultOpenAIBaseURL, "base URL of the OpenAI-compatible API (vLLM, Ollama, LM Studio, llama.cpp: http://host:port/v1)")
	fs.StringVar(&c.OpenAI.Model, "openai-model", DefaultOpenAIModel, "model for the openai backend")
	fs.StringVar(&c.OpenAI.APIKeyFile, "openai-api-key-file", "", "file holding the OpenAI API key (default: $OPENAI_API_KEY)")
	fs.StringVar(&c.Anthropic.BaseURL, "anthropic-base-url", DefaultAnthropicBaseURL, "base URL of the Anthropic API")
	fs.StringVar(&c.Anthropic.Model, "anthropic-model", DefaultAnthropicModel, "model for the anthropic backend")
	fs.StringVar(&c.Anthropic.APIKeyFile, "anthropic-api-key-file", "", "file holding the Anthropic API key (default: $ANTHROPIC_API_KEY)")
	fs.IntVar(&c.MaxRetries, "planner-max-retries", 3, "retries of a model call on 408, 409, 429, 5xx and connection errors (Retry-After is honoured)")
	fs.DurationVar(&c.CallTimeout, "planner-call-timeout", 60*time.Second, "timeout of each attempt of a model call")
	fs.DurationVar(&c.RetryBudget, "planner-retry-budget", DefaultRetryBudget, "total time for all attempts of one model call and the waits between them; keep it below the supervisor's --planner-timeout")
	fs.DurationVar(&c.MaxRetryAfter, "planner-max-retry-after", llm.DefaultMaxRetryAfter, "longest Retry-After a provider may ask for; beyond it the call fails at once with that reason")
	fs.Float64Var(&c.Temperature, "planner-temperature", 0.1, "model temperature: 0 to 2 for openai, 0 to 1 for anthropic; negative leaves the provider's default (needed for reasoning models)")
	fs.IntVar(&c.MaxOutputTokens, "planner-max-output-tokens", 4096, "cap on the tokens of one model answer")
	fs.StringVar(&c.PlanCache, "plan-cache", CacheOff, "plan cache: off, example (offer a cached plan to the model) or reuse (reuse it for the same goal and tools)")
	fs.DurationVar(&c.PlanCacheTTL, "plan-cache-ttl", 7*24*time.Hour, "how long a cached plan is kept")
	fs.StringVar(&c.EscalationBackend, "escalation-backend", "", "model backend (openai or anthropic) asked again with --escalation-model when confidence is low or the answer stays invalid")
	fs.StringVar(&c.EscalationModel, "escalation-model", "", "stronger model used for escalation")
	fs.Float64Var(&c.EscalationThreshold, "escalation-threshold", 0.5, "confidence below which the escalation model is asked")
}

var backendNames = []string{BackendPlaybook, BackendOpenAI, BackendAnthropic, BackendReplay}

// What the replay backend does with a miss (--replay-miss).
const (
	ReplayMissError = "error"
	ReplayMissLive  = "live"
)

// Validate checks the configuration without reading files or the
// environment, naming the flag and value at fault.
func (c BackendConfig) Validate() error {
	var errs []error
	if !slices.Contains(backendNames, c.Backend) {
		errs = append(errs, fmt.Errorf("--planner-backend %q: want playbook, openai, anthropic or replay", c.Backend))
	}
	errs = append(errs, c.validateReplay())
	for _, p := range []struct {
		flag string
		url  string
	}{{"--openai-base-url", c.OpenAI.BaseURL}, {"--anthropic-base-url", c.Anthropic.BaseURL}} {
		if u, err := url.Parse(p.url); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s %q: want an http:// or https:// URL", p.flag, p.url))
		}
	}
	if c.Backend == BackendOpenAI && c.OpenAI.Model == "" {
		errs = append(errs, errors.New("--openai-model: required with --planner-backend openai"))
	}
	if c.Backend == BackendAnthropic && c.Anthropic.Model == "" {
		errs = append(errs, errors.New("--anthropic-model: required with --planner-backend anthropic"))
	}
	if c.MaxRetries < 0 || c.MaxRetries > 10 {
		errs = append(errs, fmt.Errorf("--planner-max-retries %d: want 0 to 10", c.MaxRetries))
	}
	if c.CallTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--planner-call-timeout %s: must be positive", c.CallTimeout))
	}
	if c.Temperature > 2 {
		errs = append(errs, fmt.Errorf("--planner-temperature %v: want at most 2 (negative for the provider's default)", c.Temperature))
	} else if c.Temperature > MaxAnthropicTemperature && (c.Backend == BackendAnthropic || c.EscalationBackend == BackendAnthropic) {
		errs = append(errs, fmt.Errorf("--planner-temperature %v: the anthropic backend accepts 0 to %v (negative for the provider's default)", c.Temperature, MaxAnthropicTemperature))
	}
	if c.RetryBudget < 0 {
		errs = append(errs, fmt.Errorf("--planner-retry-budget %s: must be positive", c.RetryBudget))
	}
	if c.MaxRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("--planner-max-retry-after %s: must not be negative", c.MaxRetryAfter))
	}
	if c.MaxOutputTokens < 256 {
		errs = append(errs, fmt.Errorf("--planner-max-output-tokens %d: want at least 256", c.MaxOutputTokens))
	}
	if !slices.Contains([]string{CacheOff, CacheExample, CacheReuse}, c.PlanCache) {
		errs = append(errs, fmt.Errorf("--plan-cache %q: want off, example or reuse", c.PlanCache))
	}
	if c.PlanCache != CacheOff && c.PlanCacheTTL <= 0 {
		errs = append(errs, fmt.Errorf("--plan-cache-ttl %s: must be positive", c.PlanCacheTTL))
	}
	switch c.EscalationBackend {
	case "":
	case BackendOpenAI, BackendAnthropic:
		if c.EscalationModel == "" {
			errs = append(errs, fmt.Errorf("--escalation-model: required with --escalation-backend %s", c.EscalationBackend))
		}
		if c.Backend == BackendPlaybook || c.Backend == BackendReplay {
			errs = append(errs, errors.New("--escalation-backend: escalation needs a model backend as --planner-backend"))
		}
	default:
		errs = append(errs, fmt.Errorf("--escalation-backend %q: want openai or anthropic", c.EscalationBackend))
	}
	if c.EscalationThreshold < 0 || c.EscalationThreshold > 1 {
		errs = append(errs, fmt.Errorf("--escalation-threshold %v: want 0 to 1", c.EscalationThreshold))
	}
	return errors.Join(errs...)
}

// backends are the constructed backends of a planner.
type backends struct {
	byName     map[string]Backend
	def        string
	escalation Backend
	playbooks  int
}

// buildBackends loads the playbooks and builds the model backends cfg asks
// for: the default backend always (an error when it cannot be built), and
// with AllowOverride every other backend that is configured.
func buildBackends(cfg BackendConfig, logger *slog.Logger) (*backends, error) {
	bs := &backends{byName: map[string]Backend{}, def: cfg.Backend}
	var srcs []playbook.Source
	for _, dir := range cfg.Playbooks {
		for _, d := range strings.Split(dir, ",") {
			switch d = strings.TrimSpace(d); d {
			case "":
			case BuiltinDemoPlaybooks:
				srcs = append(srcs, playbook.Source{FS: playbook.DemoFS, Name: BuiltinDemoPlaybooks})
			default:
				srcs = append(srcs, playbook.Dir(d))
			}
		}
	}
	if cfg.BuiltinPlaybooks != nil {
		srcs = append(srcs, playbook.Source{FS: cfg.BuiltinPlaybooks, Name: "builtin"})
	}
	set, err := playbook.Load(srcs...)
	if err != nil {
		return nil, fmt.Errorf("--playbooks: %w", err)
	}
	bs.playbooks = set.Len()
	if set.Len() > 0 || cfg.Backend == BackendPlaybook {
		bs.byName[BackendPlaybook] = set
	}
	if set.Len() == 0 && cfg.Backend == BackendPlaybook {
		// The service still starts (health, reflection); every Plan call
		// answers that no playbook matches and how to add one.
		logger.Warn("no playbooks loaded: every goal will be refused; pass --playbooks DIR with playbook YAML files, or plan with a model (--planner-backend openai or anthropic)")
	}
	for _, name := range []string{BackendOpenAI, BackendAnthropic} {
		if name != cfg.Backend && !cfg.AllowOverride {
			continue
		}
		b, err := modelBackend(cfg, name, "")
		switch {
		case err != nil && name == cfg.Backend:
			return nil, err
		case err != nil:
			logger.Info("backend not available for overrides", "backend", name, "reason", err.Error())
		default:
			bs.byName[name] = b
		}
	}
	if cfg.EscalationBackend != "" {
		b, err := modelBackend(cfg, cfg.EscalationBackend, cfg.EscalationModel)
		if err != nil {
			return nil, fmt.Errorf("--escalation-backend: %w", err)
		}
		bs.escalation = b
	}
	if cfg.Backend == BackendReplay {
		b, err := replayFrom(cfg, bs)
		if err != nil {
			return nil, err
		}
		bs.byName[BackendReplay] = b
		if cfg.AllowOverride {
			// A replay answers what the recording asked, whichever backend
			// the request named (a model critic's --critic-backend openai),
			// never a live backend: misses go where --replay-miss says.
			for _, name := range []string{BackendPlaybook, BackendOpenAI, BackendAnthropic} {
				bs.byName[name] = b
			}
		}
	}
	if cfg.Record != "" {
		cas, err := cassette.Open(cfg.Record, nil)
		if err != nil {
			return nil, fmt.Errorf("--record: %w", err)
		}
		for name, b := range bs.byName {
			bs.byName[name] = RecordBackend(b, cas)
		}
		if bs.escalation != nil {
			bs.escalation = RecordBackend(bs.escalation, cas)
		}
	}
	if cfg.Wrap != nil {
		for name, b := range bs.byName {
			bs.byName[name] = cfg.Wrap(b)
		}
	}
	return bs, nil
}

// provider describes how to build one model provider.
type provider struct {
	cfg        ProviderConfig
	env        string
	keyFlag    string
	defaultURL string
	new        func(llm.ProviderConfig) llm.Provider
}

func providers(cfg BackendConfig) map[string]provider {
	return map[string]provider{
		BackendOpenAI: {cfg: cfg.OpenAI, env: "OPENAI_API_KEY", keyFlag: "--openai-api-key-file", defaultURL: DefaultOpenAIBaseURL,
			new: func(c llm.ProviderConfig) llm.Provider { return openai.New(c) }},
		BackendAnthropic: {cfg: cfg.Anthropic, env: "ANTHROPIC_API_KEY", keyFlag: "--anthropic-api-key-file", defaultURL: DefaultAnthropicBaseURL,
			new: func(c llm.ProviderConfig) llm.Provider { return anthropic.New(c) }},
	}
}

// modelBackend builds the llm backend of a provider, with model when set.
func modelBackend(cfg BackendConfig, name, model string) (*llm.Backend, error) {
	pv, ok := providers(cfg)[name]
	if !ok {
		return nil, fmt.Errorf("unknown model backend %q", name)
	}
	key, err := apiKey(pv.cfg.APIKeyFile, pv.env, pv.keyFlag)
	if err != nil {
		return nil, err
	}
	// The official API needs a key; a local compatible server may not.
	if key == "" && strings.HasPrefix(pv.cfg.BaseURL, pv.defaultURL) {
		return nil, fmt.Errorf("--planner-backend %s: no API key; set %s or %s", name, pv.env, pv.keyFlag)
	}
	if model == "" {
		model = pv.cfg.Model
	}
	if name == BackendAnthropic && cfg.Temperature > MaxAnthropicTemperature {
		return nil, fmt.Errorf("--planner-temperature %v: the anthropic backend accepts 0 to %v", cfg.Temperature, MaxAnthropicTemperature)
	}
	pc := llm.ProviderConfig{
		BaseURL:       pv.cfg.BaseURL,
		APIKey:        key,
		Model:         model,
		MaxRetries:    cfg.MaxRetries,
		CallTimeout:   cfg.CallTimeout,
		RetryBudget:   cmp.Or(cfg.RetryBudget, DefaultRetryBudget),
		MaxRetryAfter: cfg.MaxRetryAfter,
		// Provider calls become child spans of the planner call.
		HTTPClient: &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport)},
	}
	if cfg.Temperature >= 0 {
		t := cfg.Temperature
		pc.Temperature = &t
	}
	return llm.New(pv.new(pc), llm.Options{Name: name, Model: model, MaxOutputTokens: int64(cfg.MaxOutputTokens), Validate: validatePlan})
}

// apiKey reads the key from file, or else from the environment variable.
func apiKey(file, env, flag string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(env)), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	key := strings.TrimSpace(string(data))
	if key == "" {
		return "", fmt.Errorf("%s %s: file is empty", flag, file)
	}
	return key, nil
}
