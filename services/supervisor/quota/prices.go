package quota

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"sort"
	"strings"
)

// Prices maps a model name to its price. The entry "*", when present,
// prices the models the table does not name (and model usage the run log
// records without a model: rejected plans, the model critic by backend).
type Prices map[string]Price

// Price is a model's price per million tokens, in micro-dollars.
type Price struct {
	// InputPerMillion is the price of a million input tokens.
	InputPerMillion int64 `json:"input_per_million_micros"`
	// OutputPerMillion is the price of a million output tokens.
	OutputPerMillion int64 `json:"output_per_million_micros"`
}

// maxPricePerMillion bounds a price (a million dollars per million
// tokens), so that costs cannot overflow.
const maxPricePerMillion = 1_000_000_000_000

// LoadPrices reads a model price table: a JSON object of model name to
// {"input_per_million_micros": N, "output_per_million_micros": N}
// (--model-prices). An empty path is an empty table. Errors name the file,
// the model and the field at fault.
func LoadPrices(path string) (Prices, error) {
	if path == "" {
		return Prices{}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--model-prices: %w", err)
	}
	p, err := ParsePrices(b)
	if err != nil {
		return nil, fmt.Errorf("--model-prices %s: %w", path, err)
	}
	return p, nil
}

// ParsePrices decodes a price table (see LoadPrices).
func ParsePrices(b []byte) (Prices, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("want a JSON object of model name to {\"input_per_million_micros\": N, \"output_per_million_micros\": N}: %w", err)
	}
	models := make([]string, 0, len(raw))
	for m := range raw {
		models = append(models, m)
	}
	sort.Strings(models)
	out := make(Prices, len(raw))
	var errs []error
	for _, m := range models {
		if strings.TrimSpace(m) == "" {
			errs = append(errs, errors.New("a model name is empty"))
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw[m], &fields); err != nil {
			errs = append(errs, fmt.Errorf("model %q: want an object with input_per_million_micros and output_per_million_micros", m))
			continue
		}
		var p Price
		for name, v := range fields {
			var dst *int64
			switch name {
			case "input_per_million_micros":
				dst = &p.InputPerMillion
			case "output_per_million_micros":
				dst = &p.OutputPerMillion
			default:
				errs = append(errs, fmt.Errorf("model %q: unknown field %q (want input_per_million_micros, output_per_million_micros)", m, name))
				continue
			}
			n, err := wholeNumber(v)
			if err != nil || n < 0 || n > maxPricePerMillion {
				errs = append(errs, fmt.Errorf("model %q: %s: want a whole number of micro-dollars from 0 to %d, got %s", m, name, int64(maxPricePerMillion), bytes.TrimSpace(v)))
				continue
			}
			*dst = n
		}
		if _, ok := fields["input_per_million_micros"]; !ok {
			errs = append(errs, fmt.Errorf("model %q: input_per_million_micros is required", m))
		}
		if _, ok := fields["output_per_million_micros"]; !ok {
			errs = append(errs, fmt.Errorf("model %q: output_per_million_micros is required", m))
		}
		out[m] = p
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// wholeNumber decodes a JSON number that is an integer.
func wholeNumber(v json.RawMessage) (int64, error) {
	var n json.Number
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	if err := d.Decode(&n); err != nil {
		return 0, err
	}
	i, ok := new(big.Int).SetString(n.String(), 10)
	if !ok || !i.IsInt64() {
		return 0, fmt.Errorf("not a whole number: %s", n)
	}
	return i.Int64(), nil
}

// price returns model's price and whether the table has one (or "*").
func (p Prices) price(model string) (Price, bool) {
	if pr, ok := p[model]; ok && model != "" {
		return pr, true
	}
	pr, ok := p["*"]
	return pr, ok
}

// Cost is the price of tokens of model in micro-dollars (rounded to the
// nearest), and whether the table prices the model.
func (p Prices) Cost(model string, input, output int64) (int64, bool) {
	pr, ok := p.price(model)
	if !ok {
		return 0, false
	}
	// Big integers: a million-dollar price times billions of tokens
	// overflows int64 before the division.
	c := new(big.Int).Mul(big.NewInt(input), big.NewInt(pr.InputPerMillion))
	c.Add(c, new(big.Int).Mul(big.NewInt(output), big.NewInt(pr.OutputPerMillion)))
	c.Add(c, big.NewInt(500_000))
	c.Quo(c, big.NewInt(1_000_000))
	if !c.IsInt64() {
		return 1<<63 - 1, true
	}
	return c.Int64(), true
}
