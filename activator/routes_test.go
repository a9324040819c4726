package activator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

func TestRoutePick(t *testing.T) {
	r := compileRoutes(config.Routes{Routes: []config.Route{{Name: "chat",
		Rules: []config.Rule{
			{Match: config.Match{Header: &config.HeaderMatch{Name: "X-Tier", Value: "gold"}}, To: "gold"},
			{Match: config.Match{Tenants: []string{"acme"}, Tiers: []string{"batch"}}, To: "acme-batch"},
			{Match: config.Match{Regex: `(?i)\bprove\b`}, To: "math"},
			{Match: config.Match{Keywords: []string{"SQL", "python"}}, To: "code"},
			{Match: config.Match{MinMaxTokens: 1000}, To: "long-answer"},
			{Match: config.Match{MaxPromptTokens: 10}, To: "small"},
		},
		Split: []config.Weighted{{To: "large", Weight: 3}, {To: "canary", Weight: 1}}}}}, nil).routes["chat"]
	for _, tc := range []struct {
		name string
		f    requestFacts
		draw int
		want string
	}{
		{"a header", requestFacts{header: http.Header{"X-Tier": {"gold"}}, promptTokens: 5}, 0, "gold"},
		{"tenant and tier both", requestFacts{caller: Caller{TenantName: "acme", Tier: "batch"}, promptTokens: 50}, 0, "acme-batch"},
		{"tenant by id, tier default", requestFacts{caller: Caller{TenantID: "acme"}, promptTokens: 50}, 0, "large"},
		{"a regex", requestFacts{text: func() string { return "Prove that 2+2=4" }, promptTokens: 50}, 0, "math"},
		{"a keyword, case folded", requestFacts{text: func() string { return "write sql for me" }, promptTokens: 50}, 0, "code"},
		{"max_tokens asked", requestFacts{maxTokens: 2000, promptTokens: 50}, 0, "long-answer"},
		{"a short prompt", requestFacts{promptTokens: 10}, 0, "small"},
		{"the split's first share", requestFacts{promptTokens: 11}, 2, "large"},
		{"the split's second share", requestFacts{promptTokens: 11}, 3, "canary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f
			if f.text == nil {
				f.text = func() string { return "" }
			}
			if got := r.pick(&f, func(n int) int {
				if n != 4 {
					t.Fatalf("drawn among %d, want the weights' total 4", n)
				}
				return tc.draw
			}); got != tc.want {
				t.Fatalf("picked %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWithModel(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"chat","prompt":"x"}`, `{"model":"small","prompt":"x"}`},
		{`{ "prompt" : "model" , "model" :  "chat" }`, `{ "prompt" : "model" , "model" :  "small" }`},
		{`{"messages":[{"role":"user","content":"{\"model\":\"chat\"}"}],"model":"chat"}`,
			`{"messages":[{"role":"user","content":"{\"model\":\"chat\"}"}],"model":"small"}`},
	} {
		got, err := withModel([]byte(tc.in), "small")
		if err != nil || string(got) != tc.want {
			t.Errorf("withModel(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{`[1]`, `{"prompt":"x"}`, `{"model":`} {
		if _, err := withModel([]byte(bad), "small"); err == nil {
			t.Errorf("withModel(%s): no error", bad)
		}
	}
}

// multiResolver knows a set of deployments.
type multiResolver struct{ names []string }

func (r multiResolver) Lookup(name string) (string, config.Spec, bool) {
	for _, n := range r.names {
		if n == name {
			spec := config.Default()
			spec.Buffer.Timeout = config.Duration(2 * time.Second)
			return "sha256:" + name, spec, true
		}
	}
	return "", config.Spec{}, false
}
func (multiResolver) Poke(string) {}

// modelEngine answers a completion with the model named in the body.
func modelEngine(t *testing.T, seen *sync.Map, name string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Model string }
		json.NewDecoder(r.Body).Decode(&body)
		seen.Store(name, body.Model+" auth="+r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"text_completion","model":%q,"choices":[{"text":"ok"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, body.Model)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestServeRoutesAndFallbacks: an auto rule sends short prompts to the
// small deployment and long ones to the large; with the large one's
// replica dead its requests are served by the small one, with both dead
// by the external provider (under its model name and with its key, never
// the client's), and with the provider down too they get a 503 with
// Retry-After; once the provider is back its breaker lets it serve again.
func TestServeRoutesAndFallbacks(t *testing.T) {
	var seen sync.Map
	small, large := modelEngine(t, &seen, "small"), modelEngine(t, &seen, "large")
	ext := modelEngine(t, &seen, "ext")
	extAddr := ext.Listener.Addr().String()
	t.Setenv("STOKE_TEST_EXT_KEY", "sk-ext")
	a := New(Options{Resolver: multiResolver{names: []string{"small", "large"}}, Retries: 1,
		ProviderBreaker: BreakerOptions{Failures: 2, Cooldown: 200 * time.Millisecond}})
	ts := httptest.NewServer(a)
	defer ts.Close()
	a.AddReplica("small", "s1", engineAddr(small), 0)
	a.AddReplica("large", "l1", engineAddr(large), 0)
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	file := config.Routes{
		Routes: []config.Route{{Name: "chat", Rules: []config.Rule{{Match: config.Match{MaxPromptTokens: 8}, To: "small"}},
			Split: []config.Weighted{{To: "large", Weight: 1}}, Fallbacks: []string{"small", "ext"}, FallbackAfter: config.Duration(300 * time.Millisecond)}},
		Providers: []config.Provider{{Name: "ext", BaseURL: ext.URL + "/v1", Model: "gpt-x", APIKeyEnv: "STOKE_TEST_EXT_KEY"}},
	}
	if _, err := NewRouteBook(context.Background(), a, st, file, nil); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	send := func(prompt string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"model":"chat","prompt":%q}`, prompt)))
		req.Header.Set("Authorization", "Bearer sk-stoke-client")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	short, long := "hi", strings.Repeat("a long prompt ", 10)
	expect := func(prompt, deployment, sawModel string) {
		t.Helper()
		resp, body := send(prompt)
		if resp.StatusCode != 200 || resp.Header.Get(DeploymentHeader) != deployment {
			t.Fatalf("%d %s served by %q, want 200 from %s", resp.StatusCode, body, resp.Header.Get(DeploymentHeader), deployment)
		}
		if got, _ := seen.Load(deployment); !strings.HasPrefix(got.(string), sawModel+" ") {
			t.Fatalf("%s saw %q, want model %s", deployment, got, sawModel)
		}
	}
	expect(short, "small", "small")
	expect(long, "large", "large")

	large.Close() // its replica is dead: connections refused
	expect(long, "small", "small")
	small.Close()
	expect(long, "ext", "gpt-x")
	if got, _ := seen.Load("ext"); got != "gpt-x auth=Bearer sk-ext" {
		t.Fatalf("the provider saw %q: want its own model and key", got)
	}

	ext.Close()
	for range 3 { // failures, then an open breaker: each a 503 at once
		resp, body := send(long)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, `"error"`) {
			t.Fatalf("everything down: %d %v %s; want 503 with Retry-After", resp.StatusCode, resp.Header, body)
		}
	}
	// Failures first; once its breaker is open, no room before fallback_after.
	failed := counterValue(t, a.metrics.fallback.WithLabelValues("chat", "large", "small", reasonFailed))
	noRoom := counterValue(t, a.metrics.fallback.WithLabelValues("chat", "large", "small", reasonNoCapacity))
	if failed == 0 || failed+noRoom != 5 {
		t.Fatalf("fallbacks from large to small: %v failed, %v no capacity; want the 5 requests since its death, the first failed", failed, noRoom)
	}

	ln, err := net.Listen("tcp", extAddr) // the provider is back where it was
	if err != nil {
		t.Skipf("cannot listen on the provider's old address again: %v", err)
	}
	back := &httptest.Server{Listener: ln, Config: &http.Server{Handler: ext.Config.Handler}}
	back.Start()
	defer back.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, _ := send(long)
		if resp.StatusCode == 200 && resp.Header.Get(DeploymentHeader) == "ext" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the provider is healthy again but its breaker never let a request through: %d", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BenchmarkRouteHealthyPath measures what a route with two rules (a
// keyword rule, which reads the last user message, and a prompt-length
// rule) and a fallback chain adds to a chat request on the healthy path:
// resolving it and rewriting the body's model for the chosen deployment.
func BenchmarkRouteHealthyPath(b *testing.B) {
	table := compileRoutes(config.Routes{Routes: []config.Route{{Name: "chat",
		Rules: []config.Rule{{Match: config.Match{Keywords: []string{"sql"}}, To: "code"}, {Match: config.Match{MaxPromptTokens: 256}, To: "small"}},
		Split: []config.Weighted{{To: "large", Weight: 1}}, Fallbacks: []string{"small", "ext"}}}}, nil)
	body := []byte(`{"model":"chat","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Tell me a short story about a girl named Lily and her dog."}],"max_tokens":64,"stream":true}`)
	var ir inferenceRequest
	if err := json.Unmarshal(body, &ir); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		f := requestFacts{promptTokens: len(ir.Messages) / promptTokenBytes, maxTokens: ir.maxTokens(), text: func() string { return lastUserText(&ir) }}
		_, dep := table.resolve("chat", &f, randIntN)
		if _, err := withModel(body, dep); err != nil {
			b.Fatal(err)
		}
	}
}

// TestServeRouteContextFallback: a prompt the chosen deployment's context
// cannot hold goes to the next target; with no next target, the client
// gets the engine's 400 context_length_exceeded as it was.
func TestServeRouteContextFallback(t *testing.T) {
	const tooLong = `{"error":{"message":"prompt is too long","type":"invalid_request_error","param":"prompt","code":"context_length_exceeded"}}`
	short := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, tooLong)
	}))
	defer short.Close()
	var seen sync.Map
	long := modelEngine(t, &seen, "long")
	var mu sync.Mutex
	var outcomes []Outcome
	a := New(Options{Resolver: multiResolver{names: []string{"short", "long"}}, Admit: func(context.Context, http.ResponseWriter, AdmitRequest) (Admitted, *openai.Error) {
		return Admitted{Hold: true, Done: func(o Outcome) { mu.Lock(); outcomes = append(outcomes, o); mu.Unlock() }}, nil
	}})
	ts := httptest.NewServer(a)
	defer ts.Close()
	a.AddReplica("short", "s1", engineAddr(short), 0)
	a.AddReplica("long", "l1", engineAddr(long), 0)
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := NewRouteBook(context.Background(), a, st, config.Routes{Routes: []config.Route{
		{Name: "chat", Split: []config.Weighted{{To: "short", Weight: 1}}, Fallbacks: []string{"long"}},
		{Name: "only-short", Split: []config.Weighted{{To: "short", Weight: 1}}},
	}}, nil); err != nil {
		t.Fatal(err)
	}
	resp, body := post(t, ts.URL, `{"model":"chat","prompt":"a long one"}`)
	if resp.StatusCode != 200 || resp.Header.Get(DeploymentHeader) != "long" {
		t.Fatalf("%d %s from %q, want 200 from long", resp.StatusCode, body, resp.Header.Get(DeploymentHeader))
	}
	resp, body = post(t, ts.URL, `{"model":"only-short","prompt":"a long one"}`)
	if resp.StatusCode != http.StatusBadRequest || body != tooLong {
		t.Fatalf("%d %s, want the engine's 400 as it was", resp.StatusCode, body)
	}
	if n := counterValue(t, a.metrics.fallback.WithLabelValues("chat", "short", "long", reasonTooLong)); n != 1 {
		t.Fatalf("%v context_length fallbacks counted, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != 2 || outcomes[0].Route != "chat" || outcomes[0].Served != "long" || outcomes[0].Fallbacks != 1 ||
		outcomes[1].Route != "only-short" || outcomes[1].Served != "short" || outcomes[1].Fallbacks != 0 {
		t.Fatalf("outcomes %+v: want chat served by long after one fallback, then only-short by short", outcomes)
	}
}

func TestWithDefault(t *testing.T) {
	cases := []struct{ body, want string }{
		{`{"model":"m"}`, `{"speculative":false,"model":"m"}`},
		{`{ }`, `{"speculative":false }`},
		{`{}`, `{"speculative":false}`},
		{`{"model":"m","speculative":true}`, `{"model":"m","speculative":true}`},
		{`{"nested":{"speculative":1},"model":"m"}`, `{"speculative":false,"nested":{"speculative":1},"model":"m"}`},
	}
	for _, tc := range cases {
		got, err := withDefault([]byte(tc.body), "speculative", json.RawMessage("false"))
		if err != nil || string(got) != tc.want {
			t.Errorf("withDefault(%s) = %s, %v; want %s", tc.body, got, err, tc.want)
		}
		var v map[string]any
		if err == nil && json.Unmarshal(got, &v) != nil {
			t.Errorf("withDefault(%s) = %s is not JSON", tc.body, got)
		}
	}
	if _, err := withDefault([]byte(`[1]`), "speculative", json.RawMessage("false")); err == nil {
		t.Error("a body that is no object was accepted")
	}
}
