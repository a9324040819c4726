package tenancy

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/api/tenancy/redistest"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

// replicas are two gateway replicas: two Services, each on its own
// handle of one state database and its own client of one Redis.
type replicas struct {
	a, b   *Service
	sa, sb *store.Store
	now    time.Time
}

// newReplicas starts two replicas, with usage records off (on SQLite only
// one handle may hold the usage journal), so the budgets' spend starts
// from zero in Redis.
func newReplicas(t *testing.T) *replicas {
	t.Helper()
	ctx := context.Background()
	r := &replicas{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "state.db")
	addr := redistest.Start(t)
	var svcs []*Service
	var stores []*store.Store
	for range 2 {
		st, err := store.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		s, err := New(ctx, Options{Store: st, Redis: c, Now: func() time.Time { return r.now }})
		if err != nil {
			t.Fatal(err)
		}
		svcs, stores = append(svcs, s), append(stores, st)
	}
	r.a, r.b, r.sa, r.sb = svcs[0], svcs[1], stores[0], stores[1]
	return r
}

// TestReplicasNeverOvershoot: 200 concurrent admissions split across two
// replicas admit exactly as many requests as the tenant's limit lets fit,
// never one more: the Redis meters are one set of counters.
func TestReplicasNeverOvershoot(t *testing.T) {
	const prompt, maxTokens = 10, 20 // each reserves 30 tokens
	for _, tc := range []struct {
		name   string
		limits Limits
		// settle: answers end at once (using usage tokens), else never.
		settle bool
		usage  openai.Usage
		// want is how many fit; code the refusals' code.
		want int
		code string
	}{
		{"tokens per minute", Limits{TokensPerMinute: 1000}, false, openai.Usage{}, 1000 / (prompt + maxTokens), "rate_limit_exceeded"},
		{"requests per minute", Limits{RequestsPerMinute: 17}, true, openai.Usage{PromptTokens: 1, CompletionTokens: 1}, 17, "rate_limit_exceeded"},
		{"max concurrent", Limits{MaxConcurrent: 5}, false, openai.Usage{}, 5, "rate_limit_exceeded"},
		// Answers that use all they reserved: the budget fits 2000/30.
		{"budget", Limits{BudgetTokens: 2000}, true, openai.Usage{PromptTokens: prompt, CompletionTokens: maxTokens}, 2000 / (prompt + maxTokens), "insufficient_quota"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			r := newReplicas(t)
			if _, err := r.a.CreateTenant(ctx, "acme", tc.limits); err != nil {
				t.Fatal(err)
			}
			_, key, err := r.a.CreateKey(ctx, KeyRequest{Tenant: "acme"})
			if err != nil {
				t.Fatal(err)
			}
			var pctx []context.Context
			for _, s := range []*Service{r.a, r.b} { // b learns the key from the store
				p, err := s.AuthenticateContext(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				pctx = append(pctx, WithPrincipal(ctx, p))
			}
			var mu sync.Mutex
			var admitted, tokens int
			var open []func(activator.Outcome)
			var wg sync.WaitGroup
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := []*Service{r.a, r.b}[i%2]
					w := httptest.NewRecorder()
					adm, e := s.Admit(pctx[i%2], w, activator.AdmitRequest{Model: "m", PromptBytes: prompt, MaxTokens: maxTokens})
					if e != nil {
						if e.Status != http.StatusTooManyRequests || e.Code != tc.code || tc.code == "rate_limit_exceeded" && w.Header().Get("Retry-After") == "" {
							t.Errorf("refusal %d %s, Retry-After %q", e.Status, e.Code, w.Header().Get("Retry-After"))
						}
						return
					}
					if tc.settle {
						adm.Done(activator.Outcome{Status: http.StatusOK, Known: true, Usage: tc.usage})
					}
					mu.Lock()
					defer mu.Unlock()
					admitted++
					tokens += prompt + maxTokens
					if !tc.settle {
						open = append(open, adm.Done)
					}
				}()
			}
			wg.Wait()
			if tc.limits.TokensPerMinute > 0 && tokens > tc.limits.TokensPerMinute {
				t.Errorf("%d tokens reserved in a minute, limit %d", tokens, tc.limits.TokensPerMinute)
			}
			if tc.limits.BudgetTokens > 0 && int64(tokens) > tc.limits.BudgetTokens {
				t.Errorf("%d tokens spent, budget %d", tokens, tc.limits.BudgetTokens)
			}
			if admitted != tc.want {
				t.Fatalf("%d admitted across the replicas, want exactly %d", admitted, tc.want)
			}
			// What one replica admitted, the other's ends give back.
			for _, done := range open {
				done(activator.Outcome{Status: http.StatusServiceUnavailable})
			}
			if tc.limits.MaxConcurrent > 0 {
				if _, e := r.b.Admit(pctx[1], httptest.NewRecorder(), activator.AdmitRequest{Model: "m", PromptBytes: prompt, MaxTokens: maxTokens}); e != nil {
					t.Fatalf("after every request ended: %v", errString(e))
				}
			}
		})
	}
}

// TestReplicasShareKeys: a key made through one replica works on the
// other at once; a revocation or a limit change made through one holds on
// the other from its next reload; and a hash unknown to the store is
// remembered as unknown for NegativeTTL.
func TestReplicasShareKeys(t *testing.T) {
	ctx := context.Background()
	r := newReplicas(t)
	tn, err := r.a.CreateTenant(ctx, "acme", Limits{RequestsPerMinute: 1})
	if err != nil {
		t.Fatal(err)
	}
	k, key, err := r.a.CreateKey(ctx, KeyRequest{Tenant: "acme", Priority: PriorityClassBatch})
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.b.AuthenticateContext(ctx, key)
	if err != nil || p.TenantID != tn.ID || p.KeyID != k.ID || p.Priority != PriorityClassBatch {
		t.Fatalf("a key made through a, on b: %+v, %v", p, err)
	}
	pctx := WithPrincipal(ctx, p)
	if c := r.b.CallerOf(pctx); c.TenantName != "acme" {
		t.Errorf("b names the key's tenant %q, want acme", c.TenantName)
	}
	// b knows the tenant's limits too: one request a minute.
	if _, e := r.b.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m"}); e != nil {
		t.Fatal(errString(e))
	}
	if _, e := r.b.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m"}); e == nil || e.Code != "rate_limit_exceeded" {
		t.Fatalf("a second request a minute on b: %v", errString(e))
	}

	// A limit changed through a holds on b after b's reload.
	if _, err := r.a.SetTenantLimits(ctx, "acme", Limits{RequestsPerMinute: 2}); err != nil {
		t.Fatal(err)
	}
	if _, e := r.a.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m"}); e != nil {
		t.Fatalf("on a, with 2 a minute: %v", errString(e))
	}
	if err := r.b.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, e := r.b.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m"}); e == nil {
		t.Fatal("b admitted a third request with 2 a minute")
	}

	// A key revoked through a: refused on a at once, on b once it reloaded.
	if _, err := r.a.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		s       *Service
		reload  bool
		revoked bool
	}{
		{"a, at once", r.a, false, true},
		{"b, before its reload", r.b, false, false},
		{"b, after its reload", r.b, true, true},
	} {
		if tc.reload {
			if err := tc.s.Reload(ctx); err != nil {
				t.Fatal(err)
			}
		}
		_, err := tc.s.AuthenticateContext(ctx, key)
		if revoked := errors.Is(err, ErrInvalidKey) && strings.Contains(err.Error(), "revoked"); revoked != tc.revoked {
			t.Errorf("%s: Authenticate = %v, want revoked %v", tc.name, err, tc.revoked)
		}
	}

	// A hash unknown to the store stays unknown for NegativeTTL, even once
	// a key of it is recorded (by a third party, not through b).
	late := KeyPrefix + "late-key-made-behind-b-s-back-0123456789"
	if _, err := r.b.AuthenticateContext(ctx, late); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("an unknown key: %v", err)
	}
	h := sha256.Sum256([]byte(late))
	if err := r.sa.CreateAPIKey(ctx, store.APIKey{ID: "key_late", TenantID: tn.ID, Hash: h[:], Hint: Hint(late)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		after time.Duration
		ok    bool
	}{{"remembered as unknown", NegativeTTL - time.Second, false}, {"looked up again", time.Second, true}} {
		r.now = r.now.Add(tc.after)
		p, err := r.b.AuthenticateContext(ctx, late)
		if ok := err == nil && p.KeyID == "key_late"; ok != tc.ok {
			t.Errorf("%s: %+v, %v", tc.name, p, err)
		}
	}
}

// TestAuthenticateLookupFails: a store that fails the lookup is the
// server's failure, not an invalid key.
func TestAuthenticateLookupFails(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	s := testService(t, Options{Store: st})
	st.Close()
	_, err = s.AuthenticateContext(ctx, KeyPrefix+"unknown-to-this-replica-0123456789abcdef")
	if err == nil || errors.Is(err, ErrInvalidKey) {
		t.Fatalf("a failed lookup: %v, want an error that is not ErrInvalidKey", err)
	}
	if strings.Contains(err.Error(), "unknown-to-this") {
		t.Errorf("the error shows the key: %v", err)
	}
}

// TestRun: Run returns when its context ends, at once with no Refresh.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refresh time.Duration
		cancel  bool
	}{{"no refresh", 0, false}, {"refresh, until cancelled", time.Hour, true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := testService(t, Options{Refresh: tc.refresh})
			ctx, cancel := context.WithCancel(context.Background())
			if tc.cancel {
				cancel()
			} else {
				defer cancel()
			}
			done := make(chan struct{})
			go func() {
				s.Run(ctx)
				close(done)
			}()
			<-done // a Run that never returned would hang the test here
		})
	}
}
