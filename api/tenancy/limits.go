package tenancy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/openai"
)

// Limits bound what a tenant, or one of its keys, may use. Zero is no
// limit. A request must fit both its tenant's and its key's.
type Limits struct {
	// RequestsPerMinute caps the requests admitted in any minute.
	RequestsPerMinute int `json:"requests_per_minute,omitempty"`
	// TokensPerMinute caps the tokens (prompt and completion) of the
	// requests admitted in any minute.
	TokensPerMinute int `json:"tokens_per_minute,omitempty"`
	// MaxConcurrent caps the requests in flight at once.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
	// MaxTokens caps a request's max_tokens; it is also the max_tokens of
	// a request that sets none.
	MaxTokens int `json:"max_tokens,omitempty"`
}

// check refuses negative limits.
func (l Limits) check() error {
	if l.RequestsPerMinute < 0 || l.TokensPerMinute < 0 || l.MaxConcurrent < 0 || l.MaxTokens < 0 {
		return fmt.Errorf("%w: limits must not be negative", ErrInvalid)
	}
	return nil
}

// none reports whether l limits nothing.
func (l Limits) none() bool { return l == Limits{} }

// parseLimits reads stored limits.
func parseLimits(raw json.RawMessage) (Limits, error) {
	var l Limits
	if len(raw) == 0 {
		return l, nil
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		return l, fmt.Errorf("stored limits %s: %w", raw, err)
	}
	return l, nil
}

// DefaultReservedTokens is the max_tokens set on a request that names none
// and whose limits have no MaxTokens, when a tokens-per-minute limit
// applies: its reservation must have a bound.
const DefaultReservedTokens = 4096

// window is how far the per-minute limits look back.
const window = time.Minute

// reservation is one admitted request's share of a meter.
type reservation struct {
	at     time.Time
	tokens int
}

// meter enforces one holder's (a tenant's or a key's) limits. Every
// admitted request has a reservation in it until it leaves the window:
// its request counts once, its tokens are the bound it was admitted with
// until the answer says how many it used. So a check that lets a request
// in can never be proved wrong later: the limits are never exceeded, by
// any number of concurrent requests.
type meter struct {
	limits   Limits
	log      []*reservation // oldest first
	inflight int
}

// prune drops reservations older than the window.
func (m *meter) prune(now time.Time) {
	i := 0
	for i < len(m.log) && now.Sub(m.log[i].at) >= window {
		i++
	}
	m.log = m.log[i:]
}

// used is the requests and tokens reserved in the window.
func (m *meter) used() (requests, tokens int) {
	for _, r := range m.log {
		tokens += r.tokens
	}
	return len(m.log), tokens
}

// wait is how long until a reservation of tokens would fit (0: now).
func (m *meter) wait(now time.Time, tokens int) (requests, tok time.Duration) {
	l := m.limits
	if l.RequestsPerMinute > 0 && len(m.log) >= l.RequestsPerMinute {
		requests = m.log[len(m.log)-l.RequestsPerMinute].at.Add(window).Sub(now)
	}
	if l.TokensPerMinute > 0 {
		_, used := m.used()
		for _, r := range m.log {
			if used+tokens <= l.TokensPerMinute {
				break
			}
			used -= r.tokens
			tok = r.at.Add(window).Sub(now)
		}
		if used+tokens > l.TokensPerMinute { // it can never fit
			tok = window
		}
	}
	return requests, tok
}

// limiter holds the meters of tenants and keys.
type limiter struct {
	mu     sync.Mutex
	meters map[string]*meter // "t:" + tenant id or "k:" + key id
}

// admitLimits is the limits' admission check: a request from a principal
// with limits reserves one request and its
// tokens' upper bound (prompt bytes plus max_tokens) in its tenant's and
// key's meters at once, or neither; it is refused with 429
// rate_limit_exceeded and a Retry-After when it does not fit, 400 when
// its max_tokens is over the cap. The answer's usage then replaces the
// bound; an answer that failed frees its tokens. Every answer carries
// OpenAI's x-ratelimit-* headers of the key's (else the tenant's) limits.
func (s *Service) admitLimits(ctx context.Context, w http.ResponseWriter, r activator.AdmitRequest) (activator.Admitted, *openai.Error) {
	p, ok := FromContext(ctx)
	if !ok || p.TenantID == "" {
		return activator.Admitted{}, nil
	}
	tl, kl := s.limitsOf(p)
	if tl.none() && kl.none() {
		return activator.Admitted{}, nil
	}
	maxCap := minPositive(tl.MaxTokens, kl.MaxTokens)
	if maxCap > 0 && r.MaxTokens > maxCap {
		return activator.Admitted{}, openai.InvalidRequest("max_tokens", "max_tokens %d is over this key's limit of %d", r.MaxTokens, maxCap)
	}
	var adm activator.Admitted
	bound := r.MaxTokens
	if bound == 0 && (tl.TokensPerMinute > 0 || kl.TokensPerMinute > 0 || maxCap > 0) {
		bound = maxCap
		if bound == 0 {
			bound = DefaultReservedTokens
		}
		adm.MaxTokens = bound
	}
	tokens := r.PromptBytes + bound

	now := s.o.Now()
	s.limits.mu.Lock()
	meters := []*meter{s.meterLocked("t:"+p.TenantID, tl), s.meterLocked("k:"+p.KeyID, kl)}
	var reqWait, tokWait time.Duration
	concurrent := false
	for _, m := range meters {
		m.prune(now)
		rw, tw := m.wait(now, tokens)
		reqWait, tokWait = max(reqWait, rw), max(tokWait, tw)
		if m.limits.MaxConcurrent > 0 && m.inflight >= m.limits.MaxConcurrent {
			concurrent = true
		}
	}
	refused := reqWait > 0 || tokWait > 0 || concurrent
	res := make([]*reservation, len(meters))
	if !refused {
		for i, m := range meters {
			res[i] = &reservation{at: now, tokens: tokens}
			m.log = append(m.log, res[i])
			m.inflight++
		}
	}
	setRateHeaders(w.Header(), meters, now)
	s.limits.mu.Unlock()

	if refused {
		wait := max(reqWait, tokWait, time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
		msg := "Rate limit reached: "
		switch {
		case concurrent:
			msg += "too many requests in flight; retry when one ends."
		case tokWait >= window:
			msg += fmt.Sprintf("this request may use %d tokens (prompt and max_tokens), more than the %d tokens per minute allowed.", tokens, minPositive(tl.TokensPerMinute, kl.TokensPerMinute))
		default:
			msg += fmt.Sprintf("retry in %s.", wait.Round(time.Millisecond))
		}
		return activator.Admitted{}, &openai.Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded", Message: msg}
	}
	adm.Done = func(o activator.Outcome) {
		s.limits.mu.Lock()
		defer s.limits.mu.Unlock()
		for i, m := range meters {
			m.inflight--
			switch {
			case o.Status != http.StatusOK:
				res[i].tokens = 0 // nothing was served
			case o.Known:
				res[i].tokens = min(res[i].tokens, o.Usage.PromptTokens+o.Usage.CompletionTokens)
			}
		}
	}
	return adm, nil
}

// meterLocked returns the meter of holder with limits l; s.limits.mu is
// held.
func (s *Service) meterLocked(holder string, l Limits) *meter {
	if s.limits.meters == nil {
		s.limits.meters = map[string]*meter{}
	}
	m, ok := s.limits.meters[holder]
	if !ok {
		m = &meter{}
		s.limits.meters[holder] = m
	}
	m.limits = l
	return m
}

// limitsOf returns the limits of p's tenant and key.
func (s *Service) limitsOf(p Principal) (tenant, key Limits) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tenantLimits[p.TenantID], s.keyLimits[p.KeyID]
}

// setRateHeaders writes OpenAI's x-ratelimit-* headers: for requests and
// for tokens, those of the meter (the key's, else the tenant's) with less
// room left.
func setRateHeaders(h http.Header, meters []*meter, now time.Time) {
	for _, dim := range []struct {
		name  string
		limit func(Limits) int
		used  func(requests, tokens int) int
	}{
		{"requests", func(l Limits) int { return l.RequestsPerMinute }, func(r, _ int) int { return r }},
		{"tokens", func(l Limits) int { return l.TokensPerMinute }, func(_, t int) int { return t }},
	} {
		var limit, remaining int
		var reset time.Duration
		found := false
		for _, m := range meters {
			l := dim.limit(m.limits)
			if l <= 0 {
				continue
			}
			left := max(0, l-dim.used(m.used()))
			if !found || left < remaining {
				limit, remaining, found = l, left, true
				reset = 0
				if len(m.log) > 0 {
					reset = m.log[0].at.Add(window).Sub(now)
				}
			}
		}
		if found {
			h.Set("x-ratelimit-limit-"+dim.name, strconv.Itoa(limit))
			h.Set("x-ratelimit-remaining-"+dim.name, strconv.Itoa(remaining))
			h.Set("x-ratelimit-reset-"+dim.name, reset.Round(time.Millisecond).String())
		}
	}
}

// minPositive is the smallest of the positive ones of a and b (0 if none).
func minPositive(a, b int) int {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}
