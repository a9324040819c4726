package tenancy

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/config"
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
	// BudgetTokens caps the tokens answered per BudgetPeriod.
	BudgetTokens int64 `json:"budget_tokens,omitempty"`
	// BudgetUSD caps the money spent per BudgetPeriod, each answer priced
	// by its deployment's price (stoke.yaml's price).
	BudgetUSD float64 `json:"budget_usd,omitempty"`
	// BudgetPeriod is the budgets' period: "day" (the default) or
	// "month", in UTC.
	BudgetPeriod string `json:"budget_period,omitempty"`
}

// check refuses negative limits and unknown periods.
func (l Limits) check() error {
	switch {
	case l.RequestsPerMinute < 0 || l.TokensPerMinute < 0 || l.MaxConcurrent < 0 || l.MaxTokens < 0 || l.BudgetTokens < 0:
		return fmt.Errorf("%w: limits must not be negative", ErrInvalid)
	case math.IsNaN(l.BudgetUSD) || l.BudgetUSD < 0 || l.BudgetUSD > 1e12:
		return fmt.Errorf("%w: budget_usd must be from 0 to 1e12", ErrInvalid)
	case l.BudgetPeriod != "" && l.BudgetPeriod != "day" && l.BudgetPeriod != "month":
		return fmt.Errorf("%w: budget_period is day or month, not %q", ErrInvalid, l.BudgetPeriod)
	}
	return nil
}

// budgeted reports whether l has a budget.
func (l Limits) budgeted() bool { return l.BudgetTokens > 0 || l.BudgetUSD > 0 }

// periodStart is the start of the budget period holding now.
func (l Limits) periodStart(now time.Time) time.Time {
	now = now.UTC()
	if l.BudgetPeriod == "month" {
		return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
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
	gone   bool // left the window (pruned from its meter's log)
}

// meter enforces one holder's (a tenant's or a key's) limits. Every
// admitted request has a reservation in it until it leaves the window:
// its request counts once, its tokens are the bound it was admitted with
// until the answer says how many it used. So a check that lets a request
// in can never be proved wrong later: the limits are never exceeded, by
// any number of concurrent requests.
type meter struct {
	limits Limits
	log    []*reservation // oldest first
	// logTokens is the sum of the log's tokens.
	logTokens int
	inflight  int
	// The budget of the period that started at period: spent is what
	// answers of the period used (read back from the usage records when
	// the meter is first used), reserved what requests in flight may.
	period                   time.Time
	spentTokens, spentMicro  int64
	reservedTokens, resMicro int64
}

// overBudget reports whether reserving tokens and micro (millionths of a
// US dollar) more could cross the meter's budgets.
func (m *meter) overBudget(tokens, micro int64) bool {
	l := m.limits
	return l.BudgetTokens > 0 && m.spentTokens+m.reservedTokens+tokens > l.BudgetTokens ||
		l.BudgetUSD > 0 && m.spentMicro+m.resMicro+micro > int64(l.BudgetUSD*1e6)
}

// prune drops reservations older than the window.
func (m *meter) prune(now time.Time) {
	i := 0
	for i < len(m.log) && now.Sub(m.log[i].at) >= window {
		m.logTokens -= m.log[i].tokens
		m.log[i].gone = true
		i++
	}
	m.log = m.log[i:]
}

// reserve adds r to the window.
func (m *meter) reserve(r *reservation) {
	m.log = append(m.log, r)
	m.logTokens += r.tokens
}

// settle lowers r's tokens to what its answer used.
func (m *meter) settle(r *reservation, tokens int) {
	if tokens >= r.tokens {
		return
	}
	if !r.gone {
		m.logTokens -= r.tokens - tokens
	}
	r.tokens = tokens
}

// used is the requests and tokens reserved in the window.
func (m *meter) used() (requests, tokens int) {
	return len(m.log), m.logTokens
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
	price := s.price(r.Model)
	micro := int64(math.Ceil(float64(r.PromptBytes)*max(price.InputPer1M, price.CachedInputPer1M) + float64(bound)*price.OutputPer1M))

	now := s.o.Now()
	if err := s.loadSpend(ctx, p, tl, kl, now); err != nil {
		return activator.Admitted{}, openai.ServerError("read the budget's spend: %v", err)
	}
	s.limits.mu.Lock()
	meters := []*meter{s.meterLocked("t:"+p.TenantID, tl), s.meterLocked("k:"+p.KeyID, kl)}
	var reqWait, tokWait time.Duration
	concurrent, broke := false, false
	for _, m := range meters {
		m.prune(now)
		if m.limits.budgeted() && m.overBudget(int64(tokens), micro) {
			broke = true
		}
		rw, tw := m.wait(now, tokens)
		reqWait, tokWait = max(reqWait, rw), max(tokWait, tw)
		if m.limits.MaxConcurrent > 0 && m.inflight >= m.limits.MaxConcurrent {
			concurrent = true
		}
	}
	refused := reqWait > 0 || tokWait > 0 || concurrent || broke
	res := make([]*reservation, len(meters))
	if !refused {
		for i, m := range meters {
			res[i] = &reservation{at: now, tokens: tokens}
			m.reserve(res[i])
			m.inflight++
			m.reservedTokens += int64(tokens)
			m.resMicro += micro
		}
	}
	setRateHeaders(w.Header(), meters, now)
	s.limits.mu.Unlock()

	if broke {
		return activator.Admitted{}, &openai.Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota",
			Message: "You exceeded your current quota: this request could cross the budget of its tenant or key for this period."}
	}
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
		usedTokens, usedMicro := int64(0), int64(0)
		switch {
		case o.Status != http.StatusOK: // nothing was served
		case o.Known:
			usedTokens = int64(o.Usage.PromptTokens + o.Usage.CompletionTokens)
			usedMicro = costMicro(price, o.Usage)
		default: // served, usage unknown: charged its bound
			usedTokens, usedMicro = int64(tokens), micro
		}
		s.limits.mu.Lock()
		defer s.limits.mu.Unlock()
		for i, m := range meters {
			m.inflight--
			m.reservedTokens -= int64(tokens)
			m.resMicro -= micro
			if m.period.Equal(m.limits.periodStart(now)) {
				m.spentTokens += usedTokens
				m.spentMicro += usedMicro
			}
			m.settle(res[i], int(min(int64(res[i].tokens), usedTokens)))
		}
	}
	return adm, nil
}

// costMicro is what an answer's usage cost at price, in millionths of a
// US dollar.
func costMicro(price config.Price, u openai.Usage) int64 {
	cached := 0
	if u.PromptTokensDetails != nil {
		cached = u.PromptTokensDetails.CachedTokens
	}
	return int64(math.Round(price.Cost(u.PromptTokens, cached, u.CompletionTokens) * 1e6))
}

// price is a model's price (zero when unknown or free).
func (s *Service) price(model string) config.Price {
	if s.o.Price == nil {
		return config.Price{}
	}
	return s.o.Price(model)
}

// loadSpend makes sure the budgeted meters of p's tenant and key know
// their current period's spend, reading it back from the usage records at
// a meter's first use and starting from zero when a new period begins.
func (s *Service) loadSpend(ctx context.Context, p Principal, tl, kl Limits, now time.Time) error {
	for _, h := range []struct {
		holder, tenant, key string
		l                   Limits
	}{{"t:" + p.TenantID, p.TenantID, "", tl}, {"k:" + p.KeyID, p.TenantID, p.KeyID, kl}} {
		if !h.l.budgeted() {
			continue
		}
		start := h.l.periodStart(now)
		s.limits.mu.Lock()
		m := s.meterLocked(h.holder, h.l)
		loaded := m.period.Equal(start)
		fresh := m.period.IsZero()
		if !loaded && !fresh { // a new period: nothing spent in it yet
			m.period, m.spentTokens, m.spentMicro = start, 0, 0
		}
		if fresh && s.usage == nil { // no records to read back: from zero
			m.period, fresh = start, false
		}
		s.limits.mu.Unlock()
		if loaded || !fresh {
			continue
		}
		tokens, micro, err := s.o.Store.UsageSpend(ctx, h.tenant, h.key, start)
		if err != nil {
			return err
		}
		s.limits.mu.Lock()
		if m.period.IsZero() {
			m.period, m.spentTokens, m.spentMicro = start, tokens, micro
		}
		s.limits.mu.Unlock()
	}
	return nil
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
	for _, dim := range [...]struct {
		limitKey, remainingKey, resetKey string // canonical: set without rewriting
		limit                            func(Limits) int
		used                             func(requests, tokens int) int
	}{
		{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
			func(l Limits) int { return l.RequestsPerMinute }, func(r, _ int) int { return r }},
		{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
			func(l Limits) int { return l.TokensPerMinute }, func(_, t int) int { return t }},
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
			h[dim.limitKey] = []string{strconv.Itoa(limit)}
			h[dim.remainingKey] = []string{strconv.Itoa(remaining)}
			h[dim.resetKey] = []string{reset.Round(time.Millisecond).String()}
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
