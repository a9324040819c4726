package tenancy

import (
	"context"
	"sync"
	"time"
)

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
		l.BudgetUSD > 0 && m.spentMicro+m.resMicro+micro > l.budgetMicro()
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

// memMeters are the meters of one process: a Service alone, or several
// replicas each with limits of their own. Safe for concurrent use.
type memMeters struct {
	spend spendFunc

	mu     sync.Mutex
	meters map[string]*meter // by holder name
}

// admit is meters.admit.
func (mm *memMeters) admit(ctx context.Context, a admission) ([2]meterState, func(usedTokens, usedMicro int64), error) {
	var states [2]meterState
	if err := mm.loadSpend(ctx, a); err != nil {
		return states, nil, err
	}
	mm.mu.Lock()
	defer mm.mu.Unlock()
	var ms [2]*meter
	for i, h := range a.holders {
		m := mm.meterLocked(h.name, h.limits)
		ms[i] = m
		m.prune(a.now)
		st := &states[i]
		st.requestWait, st.tokenWait = m.wait(a.now, a.tokens)
		st.concurrent = m.limits.MaxConcurrent > 0 && m.inflight >= m.limits.MaxConcurrent
		st.overBudget = m.limits.budgeted() && m.overBudget(int64(a.tokens), a.micro)
	}
	admitted := fits(states[:])
	var res [2]*reservation
	for i, m := range ms {
		if admitted {
			res[i] = &reservation{at: a.now, tokens: a.tokens}
			m.reserve(res[i])
			m.inflight++
			m.reservedTokens += int64(a.tokens)
			m.resMicro += a.micro
		}
		states[i].requests, states[i].tokens = m.used()
		if len(m.log) > 0 {
			states[i].reset = m.log[0].at.Add(window).Sub(a.now)
		}
	}
	if !admitted {
		return states, nil, nil
	}
	return states, func(usedTokens, usedMicro int64) {
		mm.mu.Lock()
		defer mm.mu.Unlock()
		for i, m := range ms {
			m.inflight--
			m.reservedTokens -= int64(a.tokens)
			m.resMicro -= a.micro
			if m.period.Equal(m.limits.periodStart(a.now)) {
				m.spentTokens += usedTokens
				m.spentMicro += usedMicro
			}
			m.settle(res[i], int(min(int64(res[i].tokens), usedTokens)))
		}
	}, nil
}

// loadSpend makes sure the budgeted meters of a's holders know their
// current period's spend, reading it back from the usage records at a
// meter's first use and starting from zero when a new period begins.
func (mm *memMeters) loadSpend(ctx context.Context, a admission) error {
	for _, h := range a.holders {
		if !h.limits.budgeted() {
			continue
		}
		start := h.limits.periodStart(a.now)
		mm.mu.Lock()
		m := mm.meterLocked(h.name, h.limits)
		loaded := m.period.Equal(start)
		fresh := m.period.IsZero()
		if !loaded && !fresh { // a new period: nothing spent in it yet
			m.period, m.spentTokens, m.spentMicro = start, 0, 0
		}
		mm.mu.Unlock()
		if loaded || !fresh {
			continue
		}
		tokens, micro, err := mm.spend(ctx, h, start)
		if err != nil {
			return err
		}
		mm.mu.Lock()
		if m.period.IsZero() {
			m.period, m.spentTokens, m.spentMicro = start, tokens, micro
		}
		mm.mu.Unlock()
	}
	return nil
}

// meterLocked returns the meter of holder with limits l; mm.mu is held.
func (mm *memMeters) meterLocked(holder string, l Limits) *meter {
	if mm.meters == nil {
		mm.meters = map[string]*meter{}
	}
	m, ok := mm.meters[holder]
	if !ok {
		m = &meter{}
		mm.meters[holder] = m
	}
	m.limits = l
	return m
}
