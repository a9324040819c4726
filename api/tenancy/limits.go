package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
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

// periodEnd is the end of the budget period that starts at start.
func (l Limits) periodEnd(start time.Time) time.Time {
	if l.BudgetPeriod == "month" {
		return start.AddDate(0, 1, 0)
	}
	return start.AddDate(0, 0, 1)
}

// budgetMicro is the money budget in millionths of a US dollar, -1 for
// none.
func (l Limits) budgetMicro() int64 {
	if l.BudgetUSD <= 0 {
		return -1
	}
	return int64(l.BudgetUSD * 1e6)
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

// holder is the owner of one meter in an admission: a tenant, or one of
// its keys.
type holder struct {
	// name is the meter's name: "t:" + the tenant's id or "k:" + the
	// key's.
	name string
	// tenant is the tenant's id; key the key's ("" for the tenant's
	// meter).
	tenant, key string
	limits      Limits
}

// admission is one request's reservation as the meters see it: one
// request, and tokens (prompt bytes plus max_tokens) and micro (their
// price, in millionths of a US dollar) as its upper bounds.
type admission struct {
	// holders are the tenant's meter, then the key's.
	holders [2]holder
	tokens  int
	micro   int64
	// now is the caller's clock (Options.Now).
	now time.Time
}

// meterState is what one meter says of an admission, after it.
type meterState struct {
	// requestWait and tokenWait are how long until the admission would
	// fit the requests and the tokens per minute (0: it does now;
	// tokenWait is a whole window when it never can).
	requestWait, tokenWait time.Duration
	// concurrent reports MaxConcurrent requests in flight.
	concurrent bool
	// overBudget reports that the admission could cross a budget.
	overBudget bool
	// requests and tokens are those reserved in the window (the
	// admission's included when it was admitted).
	requests, tokens int
	// reset is how long until the oldest of them leaves the window (0:
	// none).
	reset time.Duration
}

// fits is the admission rule: a request is admitted when every meter has
// room for it now, in requests, tokens, concurrency and budget. It is the
// one rule of both meters: memMeters calls it, and redis_admit.lua, which
// must decide inside Redis, is its line-for-line copy (the tests hold the
// two equal on the same sequences of requests).
func fits(states []meterState) bool {
	for _, s := range states {
		if s.requestWait > 0 || s.tokenWait > 0 || s.concurrent || s.overBudget {
			return false
		}
	}
	return true
}

// meters keeps the meters of tenants and keys: in this process
// (memMeters) or in Redis, shared by every gateway replica (redisMeters).
type meters interface {
	// admit reserves a in both of its holders' meters when it fits both
	// (fits), atomically, else in neither, and returns the meters'
	// states; when a was reserved, settle ends it with what its answer
	// used. An error wrapping errMetersUnavailable means the counters
	// could not be reached.
	admit(ctx context.Context, a admission) (states [2]meterState, settle func(usedTokens, usedMicro int64), err error)
}

// errMetersUnavailable reports limit counters that cannot be reached (a
// Redis that is down): the request is refused with a 503, never admitted
// unlimited.
var errMetersUnavailable = errors.New("the limits' counters are unavailable")

// spendFunc reads what h spent since start from the usage records.
type spendFunc func(ctx context.Context, h holder, start time.Time) (tokens, micro int64, err error)

// spendSince is the spendFunc of the Service's usage records: what h's
// answers since start used, zero with usage records off (a budget then
// counts this process's answers, or the shared counters', alone).
func (s *Service) spendSince(ctx context.Context, h holder, start time.Time) (int64, int64, error) {
	if s.usage == nil {
		return 0, 0, nil
	}
	tokens, micro, err := s.o.Store.UsageSpend(ctx, h.tenant, h.key, start)
	if err != nil {
		return 0, 0, fmt.Errorf("read the spend of %s since %s: %w", h.name, start.Format(time.DateOnly), err)
	}
	return tokens, micro, nil
}

// admitLimits is the limits' admission check: a request from a principal
// with limits reserves one request and its
// tokens' upper bound (prompt bytes plus max_tokens) in its tenant's and
// key's meters at once, or neither; it is refused with 429
// rate_limit_exceeded and a Retry-After when it does not fit, 400 when
// its max_tokens is over the cap. The answer's usage then replaces the
// bound; an answer that failed frees its tokens. Every answer carries
// OpenAI's x-ratelimit-* headers of the key's (else the tenant's) limits.
// When the meters cannot be reached (Options.Redis down) the request is
// refused with 503 service_unavailable: limits fail closed.
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

	a := admission{holders: [2]holder{{name: "t:" + p.TenantID, tenant: p.TenantID, limits: tl},
		{name: "k:" + p.KeyID, tenant: p.TenantID, key: p.KeyID, limits: kl}}, tokens: tokens, micro: micro, now: s.o.Now()}
	states, settle, err := s.meters.admit(ctx, a)
	if errors.Is(err, errMetersUnavailable) {
		s.o.Logger.Error("check the limits", "tenant", p.TenantID, "key", p.KeyID, "err", err)
		w.Header().Set("Retry-After", "1")
		return activator.Admitted{}, openai.Unavailable("The rate limits cannot be checked right now; retry shortly.")
	}
	if err != nil {
		return activator.Admitted{}, openai.ServerError("check the limits: %v", err)
	}
	setRateHeaders(w.Header(), [2]Limits{tl, kl}, states)
	if settle == nil {
		return activator.Admitted{}, refusal(states, tokens, tl, kl, w.Header())
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
		settle(usedTokens, usedMicro)
	}
	return adm, nil
}

// refusal is the 429 of an admission that did not fit, with its
// Retry-After set on h: insufficient_quota when it could cross a budget,
// else rate_limit_exceeded.
func refusal(states [2]meterState, tokens int, tl, kl Limits, h http.Header) *openai.Error {
	var reqWait, tokWait time.Duration
	concurrent, broke := false, false
	for _, st := range states {
		reqWait, tokWait = max(reqWait, st.requestWait), max(tokWait, st.tokenWait)
		concurrent = concurrent || st.concurrent
		broke = broke || st.overBudget
	}
	if broke {
		return &openai.Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota",
			Message: "You exceeded your current quota: this request could cross the budget of its tenant or key for this period."}
	}
	wait := max(reqWait, tokWait, time.Second)
	h.Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
	msg := "Rate limit reached: "
	switch {
	case concurrent:
		msg += "too many requests in flight; retry when one ends."
	case tokWait >= window:
		msg += fmt.Sprintf("this request may use %d tokens (prompt and max_tokens), more than the %d tokens per minute allowed.", tokens, minPositive(tl.TokensPerMinute, kl.TokensPerMinute))
	default:
		msg += fmt.Sprintf("retry in %s.", wait.Round(time.Millisecond))
	}
	return &openai.Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded", Message: msg}
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

// limitsOf returns the limits of p's tenant and key.
func (s *Service) limitsOf(p Principal) (tenant, key Limits) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tenantLimits[p.TenantID], s.keyLimits[p.KeyID]
}

// setRateHeaders writes OpenAI's x-ratelimit-* headers: for requests and
// for tokens, those of the meter (the key's, else the tenant's) with less
// room left.
func setRateHeaders(h http.Header, limits [2]Limits, states [2]meterState) {
	for _, dim := range [...]struct {
		limitKey, remainingKey, resetKey string // canonical: set without rewriting
		limit                            func(Limits) int
		used                             func(meterState) int
	}{
		{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
			func(l Limits) int { return l.RequestsPerMinute }, func(s meterState) int { return s.requests }},
		{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
			func(l Limits) int { return l.TokensPerMinute }, func(s meterState) int { return s.tokens }},
	} {
		var limit, remaining int
		var reset time.Duration
		found := false
		for i, st := range states {
			l := dim.limit(limits[i])
			if l <= 0 {
				continue
			}
			left := max(0, l-dim.used(st))
			if !found || left < remaining {
				limit, remaining, reset, found = l, left, st.reset, true
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
