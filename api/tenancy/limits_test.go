package tenancy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

// TestAdmitNeverOvershoots: 200 concurrent admissions against a tokens-
// per-minute and a requests-per-minute limit admit no more than the
// limits allow (reservations are the upper bounds), each refusal is a 429
// rate_limit_exceeded with Retry-After and the x-ratelimit headers, and an
// answer's usage gives back what it did not use.
func TestAdmitNeverOvershoots(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits Limits
		check  func(t *testing.T, admitted, tokens int)
	}{
		{"tokens per minute", Limits{TokensPerMinute: 1000}, func(t *testing.T, admitted, tokens int) {
			if tokens > 1000 || admitted != 1000/(10+20) {
				t.Fatalf("%d admitted reserving %d tokens, limit 1000 (want %d admitted)", admitted, tokens, 1000/30)
			}
		}},
		{"requests per minute", Limits{RequestsPerMinute: 17}, func(t *testing.T, admitted, _ int) {
			if admitted != 17 {
				t.Fatalf("%d admitted, limit 17 a minute", admitted)
			}
		}},
		{"concurrency", Limits{MaxConcurrent: 5}, func(t *testing.T, admitted, _ int) {
			if admitted != 5 {
				t.Fatalf("%d admitted at once, limit 5", admitted)
			}
		}},
	} {
		for _, kind := range meterKinds() {
			t.Run(tc.name+"/"+kind.name, func(t *testing.T) {
				ctx := context.Background()
				now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
				s := kind.service(t, Options{Now: func() time.Time { return now }})
				if _, err := s.CreateTenant(ctx, "acme", tc.limits); err != nil {
					t.Fatal(err)
				}
				k, _, err := s.CreateKey(ctx, KeyRequest{Tenant: "acme"})
				if err != nil {
					t.Fatal(err)
				}
				pctx := WithPrincipal(ctx, Principal{TenantID: k.TenantID, KeyID: k.ID})
				var mu sync.Mutex
				var admitted, tokens int
				var wg sync.WaitGroup
				for range 200 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						w := httptest.NewRecorder()
						_, e := s.Admit(pctx, w, activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20})
						mu.Lock()
						defer mu.Unlock()
						if e != nil {
							if e.Status != http.StatusTooManyRequests || e.Code != "rate_limit_exceeded" || w.Header().Get("Retry-After") == "" {
								t.Errorf("refusal %d %s, Retry-After %q", e.Status, e.Code, w.Header().Get("Retry-After"))
							}
							return
						}
						admitted++
						tokens += 30
					}()
				}
				wg.Wait()
				tc.check(t, admitted, tokens)
			})
		}
	}
}

func TestAdmitReconcilesAndCaps(t *testing.T) {
	for _, kind := range meterKinds() {
		t.Run(kind.name, func(t *testing.T) { testAdmitReconcilesAndCaps(t, kind) })
	}
}

func testAdmitReconcilesAndCaps(t *testing.T, kind meterKind) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := kind.service(t, Options{Now: func() time.Time { return now }})
	s.CreateTenant(ctx, "acme", Limits{TokensPerMinute: 100, RequestsPerMinute: 50})
	k, _, _ := s.CreateKey(ctx, KeyRequest{Tenant: "acme", Limits: Limits{MaxTokens: 40}})
	pctx := WithPrincipal(ctx, Principal{TenantID: k.TenantID, KeyID: k.ID})
	w := httptest.NewRecorder()
	if _, e := s.Admit(pctx, w, activator.AdmitRequest{PromptBytes: 5, MaxTokens: 41}); e == nil || e.Status != 400 || e.Param != "max_tokens" {
		t.Fatalf("max_tokens over the key's cap: %+v", e)
	}
	adm, e := s.Admit(pctx, w, activator.AdmitRequest{PromptBytes: 5})
	if e != nil || adm.MaxTokens != 40 {
		t.Fatalf("a request with no max_tokens: %+v %v (want max_tokens set to the cap)", adm, e)
	}
	// 45 reserved of 100; a second request of 45 fits, a third does not
	// until the first gives back what it did not use.
	adm2, e := s.Admit(pctx, w, activator.AdmitRequest{PromptBytes: 5})
	if e != nil {
		t.Fatal(e)
	}
	if _, e := s.Admit(pctx, w, activator.AdmitRequest{PromptBytes: 5}); e == nil {
		t.Fatal("a third request fit 100 tokens a minute with 90 reserved")
	}
	adm.Done(activator.Outcome{Status: http.StatusOK, Usage: openai.Usage{PromptTokens: 2, CompletionTokens: 3}, Known: true})
	adm2.Done(activator.Outcome{Status: http.StatusServiceUnavailable})
	w = httptest.NewRecorder()
	if _, e := s.Admit(pctx, w, activator.AdmitRequest{PromptBytes: 5}); e != nil {
		t.Fatalf("after the refunds (5 tokens used): %v", e)
	}
	if got := w.Header().Get("x-ratelimit-remaining-requests"); got != "47" {
		t.Errorf("x-ratelimit-remaining-requests %q, want 47", got)
	}
	now = now.Add(time.Minute)
	if _, e := s.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{PromptBytes: 5, MaxTokens: 40}); e != nil {
		t.Fatalf("a minute later: %v", e)
	}
	// Without a principal (auth off) nothing is limited.
	if adm, e := s.Admit(ctx, httptest.NewRecorder(), activator.AdmitRequest{PromptBytes: 1 << 20}); e != nil || adm.Done != nil {
		t.Fatalf("no principal: %+v %v", adm, e)
	}
}

// TestAdmitBudgets: against a token and, separately, a money budget, 200
// concurrent requests never spend past it (the bounds are reserved before
// any work; refusals are 429 insufficient_quota); spend is read back from
// the usage records by a new service (a restarted serve) and starts over
// with the next period.
func TestAdmitBudgets(t *testing.T) {
	price := config.Price{InputPer1M: 2, OutputPer1M: 8}
	for _, tc := range []struct {
		name   string
		limits Limits
		spent  func(tokens int, micro int64) float64
		budget float64
	}{
		{"tokens", Limits{BudgetTokens: 2000}, func(tok int, _ int64) float64 { return float64(tok) }, 2000},
		{"money", Limits{BudgetUSD: 0.005, BudgetPeriod: "month"}, func(_ int, micro int64) float64 { return float64(micro) / 1e6 }, 0.005},
	} {
		for _, kind := range meterKinds() {
			t.Run(tc.name+"/"+kind.name, func(t *testing.T) {
				ctx := context.Background()
				now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
				st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				client := kind.client(t)
				restarts := 0
				// newSvc is a serve starting; with Redis, on counters of its
				// own (a fresh Redis), so that it too must read the spend back.
				newSvc := func() *Service {
					restarts++
					s, err := New(ctx, Options{Store: st, RecordUsage: true, Now: func() time.Time { return now },
						Price: func(string) config.Price { return price }, Redis: client, RedisPrefix: fmt.Sprintf("run%d:", restarts)})
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
				s := newSvc()
				s.CreateTenant(ctx, "acme", tc.limits)
				k, _, _ := s.CreateKey(ctx, KeyRequest{Tenant: "acme"})
				pctx := WithPrincipal(ctx, Principal{TenantID: k.TenantID, KeyID: k.ID})
				var mu sync.Mutex
				var tokens int
				var micro int64
				var wg sync.WaitGroup
				for i := range 200 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						w := httptest.NewRecorder()
						adm, e := s.Admit(pctx, w, activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20, RequestID: fmt.Sprint(i)})
						if e != nil {
							if e.Status != http.StatusTooManyRequests || e.Code != "insufficient_quota" {
								t.Errorf("refusal %d %s", e.Status, e.Code)
							}
							return
						}
						u := openai.Usage{PromptTokens: 6, CompletionTokens: 20} // what the answer used
						adm.Done(activator.Outcome{Status: http.StatusOK, Usage: u, Known: true})
						mu.Lock()
						tokens += 26
						micro += costMicro(price, u)
						mu.Unlock()
					}()
				}
				wg.Wait()
				// Refusals while others were in flight may have left room:
				// spend it, one request at a time, to the last one's worth.
				for {
					adm, e := s.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20})
					if e != nil {
						if e.Code != "insufficient_quota" {
							t.Fatalf("refusal %d %s", e.Status, e.Code)
						}
						break
					}
					u := openai.Usage{PromptTokens: 6, CompletionTokens: 20}
					adm.Done(activator.Outcome{Status: http.StatusOK, Usage: u, Known: true})
					tokens += 26
					micro += costMicro(price, u)
				}
				if got := tc.spent(tokens, micro); got > tc.budget || got < tc.budget*0.8 {
					t.Fatalf("spent %v of a budget of %v", got, tc.budget)
				}
				// A restarted serve reads the spend back and stays within it.
				s2 := newSvc()
				if _, e := s2.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20}); e == nil || e.Code != "insufficient_quota" {
					t.Fatalf("after a restart the spent budget admitted a request: %v", e)
				}
				now = now.AddDate(0, 1, 0) // the next period (a day or a month on)
				if _, e := s2.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20}); e != nil {
					t.Fatalf("in the next period: %v", e)
				}
			})
		}
	}
}

func TestKeyPriorityClass(t *testing.T) {
	ctx := context.Background()
	s := newService(t, "", nil)
	s.CreateTenant(ctx, "acme", Limits{})
	if _, _, err := s.CreateKey(ctx, KeyRequest{Tenant: "acme", Priority: "urgent"}); err == nil {
		t.Fatal("an unknown priority class was accepted")
	}
	for class, want := range map[string]int{"interactive": activator.PriorityInteractiveMax, "standard": activator.PriorityInteractive,
		"batch": activator.PriorityInteractiveMin} {
		_, key, err := s.CreateKey(ctx, KeyRequest{Tenant: "acme", Priority: class})
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.Authenticate(key)
		if err != nil {
			t.Fatal(err)
		}
		adm, e := s.Admit(WithPrincipal(ctx, p), httptest.NewRecorder(), activator.AdmitRequest{Model: "m"})
		if e != nil || adm.Priority == nil || *adm.Priority != want {
			t.Errorf("class %s: admitted with priority %v, want %d", class, adm.Priority, want)
		}
	}
}

// TestAdmitBudgetWithoutUsageRecords: with usage records off, a budget is
// kept from this process's answers alone.
func TestAdmitBudgetWithoutUsageRecords(t *testing.T) {
	for _, kind := range meterKinds() {
		t.Run(kind.name, func(t *testing.T) { testAdmitBudgetWithoutUsageRecords(t, kind) })
	}
}

func testAdmitBudgetWithoutUsageRecords(t *testing.T, kind meterKind) {
	ctx := context.Background()
	s := kind.service(t, Options{})
	s.CreateTenant(ctx, "acme", Limits{BudgetTokens: 100})
	k, _, _ := s.CreateKey(ctx, KeyRequest{Tenant: "acme"})
	pctx := WithPrincipal(ctx, Principal{TenantID: k.TenantID, KeyID: k.ID})
	admitted := 0
	for range 10 {
		adm, e := s.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20})
		if e != nil {
			break
		}
		admitted++
		adm.Done(activator.Outcome{Status: http.StatusOK, Usage: openai.Usage{PromptTokens: 10, CompletionTokens: 20}, Known: true})
	}
	if admitted != 3 {
		t.Fatalf("%d requests of 30 tokens admitted against a budget of 100, want 3", admitted)
	}
}

// TestMeterWindowSum: the meter's running sum of the window's tokens is
// the sum of its reservations through reservations, answers that settle
// them (in the window or after they left it) and pruning.
func TestMeterWindowSum(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &meter{}
	var all []*reservation
	naive := func() int {
		sum := 0
		for _, r := range m.log {
			sum += r.tokens
		}
		return sum
	}
	for i := range 200 {
		now := t0.Add(time.Duration(i) * time.Second)
		m.prune(now)
		r := &reservation{at: now, tokens: 100 + i}
		m.reserve(r)
		all = append(all, r)
		if i >= 5 { // an answer five reservations back settles, and one from long ago
			m.settle(all[i-5], 10)
		}
		if i >= 90 {
			m.settle(all[i-90], 1)
		}
		if _, got := m.used(); got != naive() {
			t.Fatalf("after %d reservations: running sum %d, the log's %d", i+1, got, naive())
		}
	}
	if n, _ := m.used(); n != 60 {
		t.Fatalf("%d reservations in the window, want 60", n)
	}
}
