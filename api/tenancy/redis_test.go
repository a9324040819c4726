package tenancy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/api/tenancy/redistest"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

// principalOf makes a tenant with limits tl and a key of it with kl on s
// and returns a context carrying the key's principal.
func principalOf(t testing.TB, s *Service, tl, kl Limits) context.Context {
	t.Helper()
	ctx := context.Background()
	tn, err := s.CreateTenant(ctx, fmt.Sprintf("acme-%d", rand.Uint32()), tl)
	if err != nil {
		t.Fatal(err)
	}
	k, _, err := s.CreateKey(ctx, KeyRequest{Tenant: tn.ID, Limits: kl})
	if err != nil {
		t.Fatal(err)
	}
	return WithPrincipal(ctx, Principal{TenantID: k.TenantID, KeyID: k.ID})
}

// TestRedisMatchesMemory: on the same sequence of admissions, answers and
// clock steps (a day's end among them), the Redis meters and the
// in-memory ones admit and refuse the same requests with the same errors
// and the same x-ratelimit-* and Retry-After headers: redis_admit.lua is
// the in-memory meter's rule, not another one.
func TestRedisMatchesMemory(t *testing.T) {
	price := config.Price{InputPer1M: 2, OutputPer1M: 8}
	// seen counts the refusals of each kind the sequences met.
	reasons := []string{"in flight", "tokens per minute allowed", "retry in", "insufficient_quota"}
	seen := map[string]int{}
	for _, tc := range []struct {
		name        string
		tenant, key Limits
		// long: many tiny requests and a few large ones, in small
		// steps: windows of hundreds of reservations, which a large
		// request must wait for many of to leave.
		long bool
	}{
		{"windows", Limits{RequestsPerMinute: 9, TokensPerMinute: 700}, Limits{TokensPerMinute: 400, MaxConcurrent: 3}, false},
		{"tight window", Limits{TokensPerMinute: 250}, Limits{RequestsPerMinute: 40}, false}, // room for one or two requests
		{"budgets", Limits{BudgetTokens: 15000, MaxConcurrent: 6}, Limits{BudgetUSD: 0.12, RequestsPerMinute: 20, BudgetPeriod: "month"}, false},
		{"everything", Limits{RequestsPerMinute: 12, TokensPerMinute: 900, MaxConcurrent: 4, BudgetTokens: 5000},
			Limits{RequestsPerMinute: 10, TokensPerMinute: 800, MaxConcurrent: 5, MaxTokens: 120, BudgetUSD: 0.01}, false},
		{"long window", Limits{TokensPerMinute: 3000}, Limits{MaxConcurrent: 1000}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Date(2026, 11, 30, 23, 50, 0, 0, time.UTC) // the day and the month end ten minutes in
			o := Options{Now: func() time.Time { return now }, Price: func(string) config.Price { return price }}
			kinds := meterKinds()
			services := []*Service{kinds[0].service(t, o), kinds[1].service(t, o)}
			var pctx []context.Context
			for _, s := range services {
				pctx = append(pctx, principalOf(t, s, tc.tenant, tc.key))
			}
			type pending struct{ done [2]func(activator.Outcome) }
			var open []pending
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			admitted, refused := 0, 0
			steps := 800
			if tc.long {
				steps = 2500
			}
			for i := range steps {
				// Steps of half a second: reservations often turn exactly a
				// window old, the edge of the window.
				step := 500 * time.Millisecond
				if tc.long {
					step = 10 * time.Millisecond
				}
				now = now.Add(time.Duration(rng.IntN(6)) * step)
				if tc.long && i == steps*3/4 {
					now = now.Add(window) // the whole window leaves at once
				}
				if len(open) > 0 && rng.IntN(3) == 0 {
					i := rng.IntN(len(open))
					var o activator.Outcome
					switch rng.IntN(4) {
					case 0:
						o = activator.Outcome{Status: http.StatusServiceUnavailable}
					case 1:
						o = activator.Outcome{Status: http.StatusOK} // usage unknown
					default:
						o = activator.Outcome{Status: http.StatusOK, Known: true,
							Usage: openai.Usage{PromptTokens: rng.IntN(40), CompletionTokens: rng.IntN(100)}}
					}
					for _, done := range open[i].done {
						done(o)
					}
					open = append(open[:i], open[i+1:]...)
					continue
				}
				req := activator.AdmitRequest{Model: "m", PromptBytes: 1 + rng.IntN(80), MaxTokens: rng.IntN(130)}
				if rng.IntN(10) == 0 {
					req.MaxTokens = 0 // reserved at the cap or DefaultReservedTokens
				}
				if tc.long {
					req = activator.AdmitRequest{Model: "m", PromptBytes: 1, MaxTokens: 1 + rng.IntN(2)}
					if i > steps/2 && rng.IntN(20) == 0 { // once tiny ones fill the window
						req.MaxTokens = 900 + rng.IntN(600)
					}
				}
				var got [2]string
				var p pending
				for i, s := range services {
					w := httptest.NewRecorder()
					adm, e := s.Admit(pctx[i], w, req)
					p.done[i] = adm.Done
					h := w.Header()
					got[i] = fmt.Sprintf("err=%v max_tokens=%d retry-after=%q limit=%q/%q remaining=%q/%q reset=%q/%q",
						errString(e), adm.MaxTokens, h.Get("Retry-After"),
						h.Get("X-Ratelimit-Limit-Requests"), h.Get("X-Ratelimit-Limit-Tokens"),
						h.Get("X-Ratelimit-Remaining-Requests"), h.Get("X-Ratelimit-Remaining-Tokens"),
						h.Get("X-Ratelimit-Reset-Requests"), h.Get("X-Ratelimit-Reset-Tokens"))
				}
				if got[0] != got[1] {
					t.Fatalf("step %d at %s, %+v:\n memory %s\n redis  %s", i, now.Format(time.TimeOnly), req, got[0], got[1])
				}
				if (p.done[0] == nil) != (p.done[1] == nil) {
					t.Fatalf("step %d: one admitted, the other not", i)
				}
				if p.done[0] != nil {
					admitted++
					open = append(open, p)
				} else if strings.HasPrefix(got[0], "err=429") {
					refused++
					for _, r := range reasons {
						if strings.Contains(got[0], r) {
							seen[r]++
						}
					}
				}
			}
			if admitted < 50 || refused < 50 { // the sequence tries both sides of the limits
				t.Fatalf("%d admitted, %d refused: the sequence does not test the limits", admitted, refused)
			}
		})
	}
	for _, r := range reasons {
		if seen[r] == 0 {
			t.Errorf("no refusal for %q: the sequences do not test it", r)
		}
	}
}

// errString is an admission's error as the client sees it.
func errString(e *openai.Error) string {
	if e == nil {
		return "nil"
	}
	return fmt.Sprintf("%d %s %s %q", e.Status, e.Type, e.Code, e.Message)
}

// TestRedisDown: when Redis cannot be reached, at start or later, a
// limited request is refused with a 503 (and Retry-After), not admitted
// unlimited.
func TestRedisDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		// client returns a client of a Redis that is, or will be, down;
		// down takes it down.
		client func(t *testing.T) (redis.UniversalClient, func())
	}{
		{"never up", func(t *testing.T) (redis.UniversalClient, func()) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close() // nothing listens there now
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
			t.Cleanup(func() { c.Close() })
			return c, func() {}
		}},
		{"went down", func(t *testing.T) (redis.UniversalClient, func()) {
			c := redis.NewClient(&redis.Options{Addr: redistest.Start(t), MaxRetries: -1})
			t.Cleanup(func() { c.Close() })
			return c, func() {
				if err := c.ShutdownNoSave(context.Background()).Err(); err != nil && !isConnClosed(err) {
					t.Fatalf("shut Redis down: %v", err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, down := tc.client(t)
			s := testService(t, Options{Redis: c})
			pctx := principalOf(t, s, Limits{RequestsPerMinute: 100}, Limits{})
			down()
			w := httptest.NewRecorder()
			adm, e := s.Admit(pctx, w, activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20})
			if e == nil || e.Status != http.StatusServiceUnavailable || e.Type != openai.TypeUnavailable {
				t.Fatalf("with Redis down: %v, want a 503", errString(e))
			}
			if adm.Done != nil || w.Header().Get("Retry-After") == "" {
				t.Fatalf("with Redis down: admitted %+v, Retry-After %q", adm, w.Header().Get("Retry-After"))
			}
			if strings.Contains(e.Message, "127.0.0.1") {
				t.Errorf("the error shows Redis's address: %s", e.Message)
			}
		})
	}
}

// isConnClosed reports the error of a command whose server went away
// answering it (SHUTDOWN).
func isConnClosed(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "connection reset")
}

// TestRedisServerClock: with no Options.Now the windows run on Redis's
// clock, and the waits it answers are within a window.
func TestRedisServerClock(t *testing.T) {
	s := meterKind{name: "redis", redis: true}.service(t, Options{})
	pctx := principalOf(t, s, Limits{RequestsPerMinute: 2}, Limits{})
	for i := range 2 {
		if _, e := s.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m", PromptBytes: 1}); e != nil {
			t.Fatalf("request %d: %v", i, errString(e))
		}
	}
	w := httptest.NewRecorder()
	_, e := s.Admit(pctx, w, activator.AdmitRequest{Model: "m", PromptBytes: 1})
	if e == nil || e.Code != "rate_limit_exceeded" {
		t.Fatalf("a third request in the minute: %v", errString(e))
	}
	if ra, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Errorf("Retry-After %q, want 1 to 60 seconds", w.Header().Get("Retry-After"))
	}
	if reset, err := time.ParseDuration(w.Header().Get("X-Ratelimit-Reset-Requests")); err != nil || reset <= 0 || reset > time.Minute {
		t.Errorf("x-ratelimit-reset-requests %q, want within a minute", w.Header().Get("X-Ratelimit-Reset-Requests"))
	}
}

// TestRedisLease: a request whose end is never settled (its replica
// died) stops holding its in-flight slot and its budget reservation after
// the lease; settling it late takes nothing twice.
func TestRedisLease(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := redisClient(t)
	s := testService(t, Options{Redis: c, RedisPrefix: "lease:", RedisLease: 5 * time.Minute, Now: func() time.Time { return now }})
	pctx := principalOf(t, s, Limits{MaxConcurrent: 1, BudgetTokens: 50}, Limits{})
	req := activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20}
	first, e := s.Admit(pctx, httptest.NewRecorder(), req)
	if e != nil {
		t.Fatal(errString(e))
	}
	if _, e := s.Admit(pctx, httptest.NewRecorder(), req); e == nil {
		t.Fatal("a second request in flight was admitted with max_concurrent 1")
	}
	now = now.Add(5 * time.Minute)
	second, e := s.Admit(pctx, httptest.NewRecorder(), req)
	if e != nil {
		t.Fatalf("after the first's lease: %v", errString(e))
	}
	first.Done(activator.Outcome{Status: http.StatusServiceUnavailable}) // too late: nothing to give back
	p, _ := FromContext(pctx)
	hash := "lease:{" + p.TenantID + "}:t:h"
	if rt, err := c.HGet(ctx, hash, "rt").Int(); err != nil || rt != 30 {
		t.Fatalf("tokens reserved in flight %d (%v), want the second's 30", rt, err)
	}
	second.Done(activator.Outcome{Status: http.StatusServiceUnavailable})
	if rt, err := c.HGet(ctx, hash, "rt").Int(); err != nil || rt != 0 {
		t.Fatalf("tokens reserved in flight %d (%v) with none in flight", rt, err)
	}
}

// TestRedisKeys: every key is under the prefix and expires; two prefixes
// on one Redis are two sets of counters.
func TestRedisKeys(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := redisClient(t)
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a := testService(t, Options{Store: st, Redis: c, RedisPrefix: "install-a:", RecordUsage: true, Now: func() time.Time { return now }})
	pctx := principalOf(t, a, Limits{RequestsPerMinute: 1, BudgetTokens: 1000}, Limits{MaxConcurrent: 2, BudgetUSD: 1})
	adm, e := a.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20})
	if e != nil {
		t.Fatal(errString(e))
	}
	adm.Done(activator.Outcome{Status: http.StatusOK, Known: true, Usage: openai.Usage{PromptTokens: 3, CompletionTokens: 4}})
	if _, e := a.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m"}); e == nil {
		t.Fatal("install a admitted a second request with 1 a minute")
	}
	b := testService(t, Options{Store: st, Redis: c, RedisPrefix: "install-b:", Now: func() time.Time { return now }})
	if _, e := b.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m"}); e != nil {
		t.Fatalf("install b, on counters of its own: %v", errString(e))
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 10 { // a's tenant's and key's w, f, h, st and sm at least
		t.Fatalf("%d keys in Redis: %q", len(keys), keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "install-a:") && !strings.HasPrefix(k, "install-b:") {
			t.Errorf("key %q is under neither prefix", k)
		}
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 || ttl > 33*24*time.Hour {
			t.Errorf("key %q expires in %s (%v), want a TTL", k, ttl, err)
		}
	}
	if v, err := c.Get(ctx, "install-a:{"+principalTenant(pctx)+"}:t:st:20261201").Int(); err != nil || v != 7 {
		t.Errorf("the tenant's tokens spent today %d (%v), want 7", v, err)
	}
}

// principalTenant is the tenant id ctx's principal has.
func principalTenant(ctx context.Context) string {
	p, _ := FromContext(ctx)
	return p.TenantID
}

// countHook counts the commands and pipelines a client sends: its round
// trips to Redis (a new connection's handshake aside).
type countHook struct{ n atomic.Int64 }

// handshake reports a command of a new connection's setup, not of a
// request.
func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if !handshake(cmd) {
				h.n.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestRedisRoundTrips: an admission is one round trip to Redis and its
// end one more; a budget's first use in a period adds two (the script
// asks for the spend, which is set, then asks again).
func TestRedisRoundTrips(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Start(t)})
	defer c.Close()
	hook := &countHook{}
	c.AddHook(hook)
	s := testService(t, Options{Redis: c, RecordUsage: true})
	pctx := principalOf(t, s, Limits{RequestsPerMinute: 1000, TokensPerMinute: 1 << 20, BudgetTokens: 1 << 30}, Limits{MaxConcurrent: 10})
	for _, tc := range []struct {
		name       string
		admit, end int64
	}{{"first use", 3, 1}, {"then", 1, 1}, {"and on", 1, 1}} {
		before := hook.n.Load()
		adm, e := s.Admit(pctx, httptest.NewRecorder(), activator.AdmitRequest{Model: "m", PromptBytes: 10, MaxTokens: 20})
		if e != nil {
			t.Fatal(errString(e))
		}
		mid := hook.n.Load()
		adm.Done(activator.Outcome{Status: http.StatusOK, Known: true, Usage: openai.Usage{PromptTokens: 3, CompletionTokens: 4}})
		if got, end := mid-before, hook.n.Load()-mid; got != tc.admit || end != tc.end {
			t.Errorf("%s: admission %d round trips, end %d; want %d and %d", tc.name, got, end, tc.admit, tc.end)
		}
	}
}

// BenchmarkAdmit is one admission and its end, with every kind of limit
// set, against each kind of meters, one at a time and from parallel
// goroutines; roundtrips/op counts Redis commands.
func BenchmarkAdmit(b *testing.B) {
	for _, kind := range meterKinds() {
		for _, parallel := range []bool{false, true} {
			name := kind.name
			if parallel {
				name += "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				o := Options{Store: benchStore(b)}
				hook := &countHook{}
				if kind.redis {
					c := redis.NewClient(&redis.Options{Addr: redistest.Start(b)})
					b.Cleanup(func() { c.Close() })
					c.AddHook(hook)
					o.Redis = c
				}
				s, err := New(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				pctx := principalOf(b, s, Limits{RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 40, MaxConcurrent: 1 << 20, BudgetTokens: 1 << 50},
					Limits{RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 40, MaxConcurrent: 1 << 20})
				req := activator.AdmitRequest{Model: "m", PromptBytes: 100, MaxTokens: 200}
				out := activator.Outcome{Status: http.StatusOK, Known: true, Usage: openai.Usage{PromptTokens: 30, CompletionTokens: 150}}
				one := func(w http.ResponseWriter) {
					adm, e := s.Admit(pctx, w, req)
					if e != nil {
						b.Fatal(errString(e))
					}
					adm.Done(out)
				}
				one(httptest.NewRecorder()) // the budget's first use
				before := hook.n.Load()
				b.ResetTimer()
				if parallel {
					b.RunParallel(func(pb *testing.PB) {
						w := httptest.NewRecorder()
						for pb.Next() {
							one(w)
						}
					})
				} else {
					w := httptest.NewRecorder()
					for b.Loop() {
						one(w)
					}
				}
				b.ReportMetric(float64(hook.n.Load()-before)/float64(b.N), "roundtrips/op")
			})
		}
	}
}

// benchStore is a fresh state store for a benchmark.
func benchStore(b *testing.B) *store.Store {
	st, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// TestRedisPruneLargeWindow: a window of more reservations than one
// script call unpacks at once leaves whole: its tokens leave the running
// sum and its entries the hash.
func TestRedisPruneLargeWindow(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := redisClient(t)
	s := testService(t, Options{Redis: c, RedisPrefix: "p:", Now: func() time.Time { return now }})
	pctx := principalOf(t, s, Limits{TokensPerMinute: 1 << 20}, Limits{})
	p, _ := FromContext(pctx)
	hash := "p:{" + p.TenantID + "}:t:h"
	req := activator.AdmitRequest{Model: "m", PromptBytes: 1, MaxTokens: 2}
	for i := range 1300 {
		adm, e := s.Admit(pctx, httptest.NewRecorder(), req)
		if e != nil {
			t.Fatal(errString(e))
		}
		adm.Done(activator.Outcome{Status: http.StatusOK, Known: true, Usage: openai.Usage{PromptTokens: 1, CompletionTokens: i % 3}})
	}
	now = now.Add(window)
	if _, e := s.Admit(pctx, httptest.NewRecorder(), req); e != nil {
		t.Fatal(errString(e))
	}
	for _, tc := range []struct {
		name string
		got  func() (int64, error)
		want int64
	}{
		{"reservations in the window", func() (int64, error) { return c.ZCard(ctx, "p:{"+p.TenantID+"}:t:w").Result() }, 1},
		{"fields of the hash (sum, rt, rm and the one)", func() (int64, error) { return c.HLen(ctx, hash).Result() }, 4},
		{"tokens in the window", func() (int64, error) { return c.HGet(ctx, hash, "sum").Int64() }, 3},
	} {
		if got, err := tc.got(); err != nil || got != tc.want {
			t.Errorf("%s: %d (%v), want %d", tc.name, got, err, tc.want)
		}
	}
}
