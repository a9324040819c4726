package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Route is a client-visible model name that resolves to deployments: its
// rules in order (the first whose match holds names the target), else its
// split (weighted targets; one target is an alias). Fallbacks are tried
// in order when the chosen target cannot serve (no room before
// FallbackAfter, every replica failing before the first byte).
type Route struct {
	// Name is the model name clients send.
	Name string `json:"name"`
	// Rules are tried in order; the first that matches picks the target.
	Rules []Rule `json:"rules,omitempty"`
	// Split is the default: targets weighted by share (at least one).
	Split []Weighted `json:"split"`
	// Fallbacks are deployments or providers, tried in order.
	Fallbacks []string `json:"fallbacks,omitempty"`
	// FallbackAfter is how long a target that is not the chain's last may
	// keep a request waiting for room before the next one is tried.
	//
	// Bounds: [0, 1h]; default DefaultFallbackAfter. The last target waits
	// its deployment's buffer.timeout.
	FallbackAfter Duration `json:"fallback_after,omitempty"`
}

// Errors of changing the routes, matched with errors.Is. Read-only.
var (
	// ErrRouteInvalid reports a route that does not check or validate
	// (the admin API answers 400).
	ErrRouteInvalid = errors.New("invalid route")
	// ErrRouteFromFile reports a change to a route the routes file
	// defines: edit the file instead (409).
	ErrRouteFromFile = errors.New("route is defined in the routes file")
)

// DefaultFallbackAfter is Route.FallbackAfter when unset.
const DefaultFallbackAfter = Duration(time.Second)

// Rule sends the requests its match holds for to a target.
type Rule struct {
	Match Match `json:"match"`
	// To is a deployment or another route.
	To string `json:"to"`
}

// Match is what a rule asks of a request; every field set must hold (an
// empty match holds for every request).
type Match struct {
	// MinPromptTokens and MaxPromptTokens bound the prompt's length in
	// tokens, estimated as its bytes ÷ 4 (0: no bound).
	MinPromptTokens int `json:"min_prompt_tokens,omitempty"`
	MaxPromptTokens int `json:"max_prompt_tokens,omitempty"`
	// MinMaxTokens and MaxMaxTokens bound the max_tokens asked for (a
	// request that names none has 0).
	MinMaxTokens int `json:"min_max_tokens,omitempty"`
	MaxMaxTokens int `json:"max_max_tokens,omitempty"`
	// Regex must match the last user message (a completion's prompt).
	Regex string `json:"regex,omitempty"`
	// Keywords: one of them must appear in the last user message, case
	// folded.
	Keywords []string `json:"keywords,omitempty"`
	// Tenants: the request's tenant (by name) must be one of them.
	Tenants []string `json:"tenants,omitempty"`
	// Tiers: the key's priority class (interactive, standard, batch) must
	// be one of them.
	Tiers []string `json:"tiers,omitempty"`
	// Header: the request must carry this header with this value.
	Header *HeaderMatch `json:"header,omitempty"`
}

// HeaderMatch is a header a request must carry, with its value.
type HeaderMatch struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Weighted is one target of a split and its share.
type Weighted struct {
	To string `json:"to"`
	// Weight is its share among the split's weights (at least 1).
	Weight int `json:"weight"`
}

// Provider is an external OpenAI-compatible API a route may fall back
// to: its base URL (up to and including /v1), the model name it serves
// the requests under, and where its key comes from (the key itself is
// never stored or shown).
type Provider struct {
	Name    string `json:"name"`
	BaseURL string `json:"base_url"`
	Model   string `json:"model"`
	// APIKeyEnv or APIKeyFile names where the key is read (at most one;
	// neither: no key).
	APIKeyEnv  string `json:"api_key_env,omitempty"`
	APIKeyFile string `json:"api_key_file,omitempty"`
	// Timeout bounds a request's wait for the provider's first byte.
	//
	// Bounds: [0, 10m]; default DefaultProviderTimeout.
	Timeout Duration `json:"timeout,omitempty"`
}

// DefaultProviderTimeout is Provider.Timeout when unset.
const DefaultProviderTimeout = Duration(30 * time.Second)

// Routes are the routes and providers the platform routes by.
type Routes struct {
	Routes    []Route    `json:"routes"`
	Providers []Provider `json:"providers,omitempty"`
}

// ParseRoute reads one route (JSON, as the admin API takes it), refusing
// unknown fields, and checks its own shape (see Route.Check).
func ParseRoute(raw []byte) (Route, error) {
	var r Route
	if err := json.Unmarshal(raw, &r); err != nil {
		return Route{}, fmt.Errorf("route: %w", err)
	}
	if err := knownFields(raw, reflect.TypeFor[Route](), ""); err != nil {
		return Route{}, fmt.Errorf("route %s: %w", r.Name, err)
	}
	return r, r.Check()
}

// ParseRoutesYAML reads a routes file: YAML (or JSON) with routes and
// providers, unknown fields refused. It checks each route and provider
// alone; Validate checks them together.
func ParseRoutesYAML(raw []byte) (Routes, error) {
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return Routes{}, fmt.Errorf("routes file: %w", err)
	}
	if _, ok := doc.(map[string]any); doc != nil && !ok {
		return Routes{}, fmt.Errorf("routes file: want a mapping, not %T", doc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return Routes{}, fmt.Errorf("routes file: %w", err)
	}
	var rs Routes
	if doc != nil {
		if err := json.Unmarshal(b, &rs); err != nil {
			return Routes{}, fmt.Errorf("routes file: %w", err)
		}
		if err := knownFields(b, reflect.TypeFor[Routes](), ""); err != nil {
			return Routes{}, fmt.Errorf("routes file: %w", err)
		}
	}
	for _, r := range rs.Routes {
		if err := r.Check(); err != nil {
			return Routes{}, err
		}
	}
	for _, p := range rs.Providers {
		if err := p.Check(); err != nil {
			return Routes{}, err
		}
	}
	return rs, nil
}

// tiers are the key priority classes a Match may name.
var tiers = []string{"interactive", "standard", "batch"}

// Check reports what is wrong with the route on its own: a name, at
// least one split target with positive weights, compiling regexes, known
// tiers, bounds.
func (r Route) Check() error {
	errf := func(format string, args ...any) error {
		return fmt.Errorf("route %q: %s", r.Name, fmt.Sprintf(format, args...))
	}
	if err := checkName(r.Name); err != nil {
		return errf("name: %v", err)
	}
	if len(r.Split) == 0 {
		return errf("split: at least one target is needed (the default)")
	}
	for i, w := range r.Split {
		if w.To == "" {
			return errf("split[%d].to is empty", i)
		}
		if w.Weight < 1 || w.Weight > 1_000_000 {
			return errf("split[%d].weight %d is outside [1, 1000000]", i, w.Weight)
		}
	}
	for i, rule := range r.Rules {
		if rule.To == "" {
			return errf("rules[%d].to is empty", i)
		}
		m := rule.Match
		for _, n := range []int{m.MinPromptTokens, m.MaxPromptTokens, m.MinMaxTokens, m.MaxMaxTokens} {
			if n < 0 {
				return errf("rules[%d].match: a bound is negative", i)
			}
		}
		if m.MaxPromptTokens > 0 && m.MinPromptTokens > m.MaxPromptTokens || m.MaxMaxTokens > 0 && m.MinMaxTokens > m.MaxMaxTokens {
			return errf("rules[%d].match: a minimum is above its maximum", i)
		}
		if m.Regex != "" {
			if _, err := regexp.Compile(m.Regex); err != nil {
				return errf("rules[%d].match.regex: %v", i, err)
			}
		}
		for _, t := range m.Tiers {
			if !slices.Contains(tiers, t) {
				return errf("rules[%d].match.tiers: %q is not one of %s", i, t, strings.Join(tiers, ", "))
			}
		}
		if h := m.Header; h != nil && h.Name == "" {
			return errf("rules[%d].match.header.name is empty", i)
		}
	}
	for i, f := range r.Fallbacks {
		if f == "" {
			return errf("fallbacks[%d] is empty", i)
		}
	}
	if d := time.Duration(r.FallbackAfter); d < 0 || d > time.Hour {
		return errf("fallback_after %v is outside [0, 1h]", d)
	}
	return nil
}

// Check reports what is wrong with the provider on its own.
func (p Provider) Check() error {
	errf := func(format string, args ...any) error {
		return fmt.Errorf("provider %q: %s", p.Name, fmt.Sprintf(format, args...))
	}
	if err := checkName(p.Name); err != nil {
		return errf("name: %v", err)
	}
	u, err := url.Parse(p.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errf("base_url %q: want an http(s) URL such as https://api.openai.com/v1", p.BaseURL)
	}
	if p.Model == "" {
		return errf("model is empty: name the model the provider serves")
	}
	if p.APIKeyEnv != "" && p.APIKeyFile != "" {
		return errf("api_key_env and api_key_file are both set; give one")
	}
	if d := time.Duration(p.Timeout); d < 0 || d > 10*time.Minute {
		return errf("timeout %v is outside [0, 10m]", d)
	}
	return nil
}

// checkName refuses names a client could not send as a model.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case len(name) > 256:
		return errors.New("longer than 256 bytes")
	case strings.ContainsAny(name, " \t\r\n"):
		return errors.New("holds white space")
	}
	return nil
}

// Validate checks routes and providers together: unique names, no route
// named like a deployment or provider, every target a deployment or a
// route (isDeployment says which names are deployments), every fallback a
// deployment or a provider, and no route reaching itself.
func (rs Routes) Validate(isDeployment func(name string) bool) error {
	routes := map[string]*Route{}
	providers := map[string]bool{}
	for _, p := range rs.Providers {
		if providers[p.Name] {
			return fmt.Errorf("provider %q is defined twice", p.Name)
		}
		providers[p.Name] = true
	}
	for i := range rs.Routes {
		r := &rs.Routes[i]
		switch {
		case routes[r.Name] != nil:
			return fmt.Errorf("route %q is defined twice", r.Name)
		case isDeployment(r.Name):
			return fmt.Errorf("route %q: a deployment has that name", r.Name)
		case providers[r.Name]:
			return fmt.Errorf("route %q: a provider has that name", r.Name)
		}
		routes[r.Name] = r
	}
	for _, r := range rs.Routes {
		for _, t := range r.targets() {
			if routes[t] == nil && !isDeployment(t) {
				return fmt.Errorf("route %q: %q is neither a deployment nor a route", r.Name, t)
			}
		}
		for _, f := range r.Fallbacks {
			if !providers[f] && !isDeployment(f) {
				return fmt.Errorf("route %q: fallback %q is neither a deployment nor a provider", r.Name, f)
			}
		}
	}
	// A route reaching itself through its targets would never resolve.
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var visit func(name string, path []string) error
	visit = func(name string, path []string) error {
		r := routes[name]
		if r == nil {
			return nil
		}
		switch state[name] {
		case onPath:
			return fmt.Errorf("routes loop: %s", strings.Join(append(path, name), " → "))
		case done:
			return nil
		}
		state[name] = onPath
		for _, t := range r.targets() {
			if err := visit(t, append(path, name)); err != nil {
				return err
			}
		}
		state[name] = done
		return nil
	}
	for _, r := range rs.Routes {
		if err := visit(r.Name, nil); err != nil {
			return err
		}
	}
	return nil
}

// targets are the names the route's rules and split point to.
func (r Route) targets() []string {
	var out []string
	for _, rule := range r.Rules {
		out = append(out, rule.To)
	}
	for _, w := range r.Split {
		out = append(out, w.To)
	}
	return out
}
