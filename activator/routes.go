package activator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/stokehq/stoke/internal/config"
)

// Caller is who sends a request, as the route rules see it.
type Caller struct {
	// TenantID and TenantName are the key's tenant ("" for none).
	TenantID, TenantName string
	// Tier is the key's priority class ("" for the default).
	Tier string
}

// routeTable is the routes in effect, compiled: rules with their regexes
// and folded keywords, splits with their total weight. It is immutable;
// the activator swaps a new one in whole (RouteBook).
type routeTable struct {
	routes    map[string]*compiledRoute
	providers map[string]*provider
}

// compiledRoute is one route, ready to match.
type compiledRoute struct {
	name          string
	rules         []compiledRule
	split         []config.Weighted
	total         int
	fallbacks     []string
	fallbackAfter time.Duration
	needsText     bool // a rule reads the last user message
}

// compiledRule is one rule, ready to match.
type compiledRule struct {
	m        config.Match
	re       *regexp.Regexp
	keywords []string // lower-cased
	to       string
}

// compileRoutes compiles checked and validated routes; providers are
// made by newProvider.
func compileRoutes(rs config.Routes, providers map[string]*provider) *routeTable {
	t := &routeTable{routes: map[string]*compiledRoute{}, providers: providers}
	for _, r := range rs.Routes {
		c := &compiledRoute{name: r.Name, split: r.Split, fallbacks: r.Fallbacks, fallbackAfter: time.Duration(r.FallbackAfter)}
		if c.fallbackAfter == 0 {
			c.fallbackAfter = time.Duration(config.DefaultFallbackAfter)
		}
		for _, w := range r.Split {
			c.total += w.Weight
		}
		for _, rule := range r.Rules {
			cr := compiledRule{m: rule.Match, to: rule.To}
			if rule.Match.Regex != "" {
				cr.re = regexp.MustCompile(rule.Match.Regex) // Route.Check compiled it
			}
			for _, k := range rule.Match.Keywords {
				cr.keywords = append(cr.keywords, strings.ToLower(k))
			}
			c.needsText = c.needsText || cr.re != nil || len(cr.keywords) > 0
			c.rules = append(c.rules, cr)
		}
		t.routes[r.Name] = c
	}
	return t
}

// requestFacts are what the rules look at in a request.
type requestFacts struct {
	promptTokens int // estimated: bytes ÷ 4
	maxTokens    int
	text         func() string // the last user message, read on demand
	caller       Caller
	header       http.Header
}

// promptTokenBytes is how many prompt bytes the rules count as a token
// (OpenAI's rule of thumb for English text).
const promptTokenBytes = 4

// resolve follows name through the routes to a deployment: the route
// the client named (nil when name is no route) and the deployment chosen.
func (t *routeTable) resolve(name string, f *requestFacts, rng func(n int) int) (*compiledRoute, string) {
	if t == nil {
		return nil, name
	}
	first := t.routes[name]
	r := first
	for range len(t.routes) + 1 { // validated loop-free: this bounds it all the same
		if r == nil {
			return first, name
		}
		name = r.pick(f, rng)
		r = t.routes[name]
	}
	return first, name
}

// pick is the target of the route's first rule that matches, else one
// drawn from its split by weight.
func (r *compiledRoute) pick(f *requestFacts, rng func(n int) int) string {
	var text string
	read := false
	for i := range r.rules {
		rule := &r.rules[i]
		if (rule.re != nil || len(rule.keywords) > 0) && !read {
			text, read = f.text(), true
		}
		if rule.matches(f, text) {
			return rule.to
		}
	}
	if len(r.split) == 1 {
		return r.split[0].To
	}
	n := rng(r.total)
	for _, w := range r.split {
		if n < w.Weight {
			return w.To
		}
		n -= w.Weight
	}
	return r.split[len(r.split)-1].To
}

func (rule *compiledRule) matches(f *requestFacts, text string) bool {
	m := &rule.m
	switch {
	case m.MinPromptTokens > 0 && f.promptTokens < m.MinPromptTokens,
		m.MaxPromptTokens > 0 && f.promptTokens > m.MaxPromptTokens,
		m.MinMaxTokens > 0 && f.maxTokens < m.MinMaxTokens,
		m.MaxMaxTokens > 0 && f.maxTokens > m.MaxMaxTokens,
		rule.re != nil && !rule.re.MatchString(text),
		len(m.Tenants) > 0 && !slices.Contains(m.Tenants, f.caller.TenantName) && !slices.Contains(m.Tenants, f.caller.TenantID),
		len(m.Tiers) > 0 && !slices.Contains(m.Tiers, tierOf(f.caller.Tier)),
		m.Header != nil && f.header.Get(m.Header.Name) != m.Header.Value:
		return false
	}
	if len(rule.keywords) > 0 {
		lower := strings.ToLower(text)
		return slices.ContainsFunc(rule.keywords, func(k string) bool { return strings.Contains(lower, k) })
	}
	return true
}

// tierOf names a key's class, the default one included.
func tierOf(class string) string {
	if class == "" {
		return "standard"
	}
	return class
}

// lastUserText is the text the rules' regexes and keywords read: the last
// user message of a chat request (its text parts joined), else the
// completion's prompt (its strings joined).
func lastUserText(ir *inferenceRequest) string {
	if len(ir.Messages) > 0 {
		var msgs []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(ir.Messages, &msgs) != nil {
			return ""
		}
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].Role == "user" {
				return contentText(msgs[i].Content)
			}
		}
		return ""
	}
	return contentText(ir.Prompt)
}

// contentText reads a string, an array of strings, or an array of content
// parts ({"type":"text","text":…}) as one text.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range parts {
		var part struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(p, &s) == nil {
			b.WriteString(s)
		} else if json.Unmarshal(p, &part) == nil {
			b.WriteString(part.Text)
		}
	}
	return b.String()
}

// provider returns the provider named name (nil when there is none).
func (t *routeTable) provider(name string) *provider {
	if t == nil {
		return nil
	}
	return t.providers[name]
}

// withModel returns body (a JSON object) with its top-level "model" set
// to name.
func withModel(body []byte, name string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("request body must be a JSON object")
	}
	quoted, _ := json.Marshal(name)
	var out []byte
	from := 0
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("read the request body: %w", err)
		}
		after := int(dec.InputOffset())
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("read the request body: %w", err)
		}
		if t != "model" {
			continue
		}
		end := int(dec.InputOffset())
		start := after + bytes.IndexByte(body[after:end], ':') + 1
		for start < end && isSpace(body[start]) {
			start++
		}
		out = append(append(out, body[from:start]...), quoted...)
		from = end
	}
	if out == nil {
		return nil, errors.New("request body has no model")
	}
	return append(out, body[from:]...), nil
}

// withDefault returns body with key set to value when the body's top-level
// object does not have key already; body is returned as it is otherwise.
func withDefault(body []byte, key string, value json.RawMessage) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	t, err := dec.Token()
	if err != nil || t != json.Delim('{') {
		return nil, errors.New("request body must be a JSON object")
	}
	open := int(dec.InputOffset())
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("read the request body: %w", err)
		}
		if t == key {
			return body, nil
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("read the request body: %w", err)
		}
	}
	quoted, _ := json.Marshal(key)
	out := make([]byte, 0, len(body)+len(quoted)+len(value)+2)
	out = append(append(append(append(out, body[:open]...), quoted...), ':'), value...)
	rest := body[open:]
	for len(rest) > 0 && isSpace(rest[0]) {
		rest = rest[1:]
	}
	if len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[open:]...), nil
}

// randIntN is the split's draw.
func randIntN(n int) int { return rand.IntN(n) }

// callerOf is who sends the request, by Options.CallerOf.
func (a *Activator) callerOf(ctx context.Context) Caller {
	if a.opts.CallerOf == nil {
		return Caller{}
	}
	return a.opts.CallerOf(ctx)
}
