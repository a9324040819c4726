package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/scaler/reconcile"
)

// storeDeployments serves deployments straight from a real state store.
type storeDeployments struct{ *store.Store }

func (s storeDeployments) UpdateSpec(ctx context.Context, name string, spec json.RawMessage) (store.Deployment, error) {
	d, err := s.Deployment(ctx, name)
	if err != nil {
		return d, err
	}
	if _, err := config.Parse(spec); err != nil {
		return d, openai.InvalidRequest("spec", "%v", err)
	}
	d.Spec = spec
	return d, s.PutDeployment(ctx, d)
}

// Promote has no canary to end (the controller's rollouts are tested in
// scaler/reconcile and cmd/stoke).
func (s storeDeployments) Promote(context.Context, string) (store.Rollout, error) {
	return store.Rollout{}, reconcile.ErrNoCanary
}

// Rollback has no canary to end either.
func (s storeDeployments) Rollback(context.Context, string) (store.Rollout, error) {
	return store.Rollout{}, reconcile.ErrNoCanary
}

// Pin records the revision pinned.
func (s storeDeployments) Pin(ctx context.Context, name, revision string) (store.Deployment, error) {
	d, err := s.Deployment(ctx, name)
	if err != nil {
		return d, err
	}
	d.Revision, d.Pinned = revision, true
	return d, s.PutDeployment(ctx, d)
}

// Unpin records the deployment unpinned.
func (s storeDeployments) Unpin(ctx context.Context, name string) (store.Deployment, error) {
	d, err := s.Deployment(ctx, name)
	if err != nil {
		return d, err
	}
	d.Pinned = false
	return d, s.PutDeployment(ctx, d)
}

// Status reports a fixed live state for chat, as a controller with two
// ready replicas would.
func (s storeDeployments) Status(name string) (reconcile.Status, bool) {
	if name != "chat" {
		return reconcile.Status{}, false
	}
	return reconcile.Status{Ready: 2, Desired: 2, Reason: "concurrency: stable avg 9.0 / target 8 → 2", LastColdStart: tier.Cache}, true
}

// Adapters lists a fixed LoRA adapter of chat, as a controller that saw
// one pushed under it would.
func (s storeDeployments) Adapters(name string) []string {
	if name != "chat" {
		return nil
	}
	return []string{"sql"}
}

// send makes one request with headers and returns the answer and its
// whole body.
func send(t *testing.T, method, url string, body io.Reader, headers map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestAPI(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, name := range []string{"chat", "org/name"} {
		if err := st.PutDeployment(ctx, store.Deployment{Name: name, Revision: "sha256:a"}); err != nil {
			t.Fatal(err)
		}
	}
	inference := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"ok":true}`)) })
	ts := httptest.NewServer(New(Options{Inference: inference, Deployments: storeDeployments{st}, Registry: prometheus.NewRegistry()}))
	defer ts.Close()

	do := func(method, path, body string) (int, string, http.Header) {
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String(), resp.Header
	}
	defaults := `"effective_spec":{"replicas":{"min":0,"max":4,"sleeping":4},"target_concurrency":8,"ttft_slo":"800ms",` +
		`"window":"1m0s","idle_delay":"30s","buffer":{"capacity":1000,"timeout":"1m0s"},"price":{"input_per_1m":0,"output_per_1m":0,"cached_input_per_1m":0},"cost":{"replica_hourly_usd":0},"forecast":{"predictive":true,"period":"24h0m0s","bucket":"1m0s"},` +
		`"rollout":{"canary_percent":0,"eval":{"file":"","metric":"exact_match","max_regression":0,"max_tokens":32,"timeout":"10m0s"}},"speculative":true}`
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		contains                 string
		allow                    string // the Allow header wanted
	}{
		{name: "models", method: "GET", path: "/v1/models", status: 200, contains: `"id":"chat"`},
		{name: "retrieve a model", method: "GET", path: "/v1/models/chat", status: 200, contains: `{"id":"chat","object":"model","created":`},
		{name: "models list adapters", method: "GET", path: "/v1/models", status: 200, contains: `"id":"chat:sql","object":"model","created":`},
		{name: "an adapter's parent", method: "GET", path: "/v1/models", status: 200, contains: `"owned_by":"stoke","parent":"chat"}`},
		{name: "retrieve an adapter", method: "GET", path: "/v1/models/chat:sql", status: 200, contains: `"parent":"chat"`},
		{name: "retrieve an unknown adapter", method: "GET", path: "/v1/models/chat:nope", status: 404, contains: `model_not_found`},
		{name: "retrieve a model named with a slash", method: "GET", path: "/v1/models/org/name", status: 200, contains: `{"id":"org/name","object":"model"`},
		{name: "retrieve a model, slash escaped", method: "GET", path: "/v1/models/org%2Fname", status: 200, contains: `"id":"org/name"`},
		{name: "retrieve an unknown model", method: "GET", path: "/v1/models/nope", status: 404,
			contains: `{"error":{"message":"The model ` + "`nope`" + ` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`},
		{name: "retrieve a prefix of a model", method: "GET", path: "/v1/models/org", status: 404, contains: "model_not_found"},
		{name: "GET on chat completions", method: "GET", path: "/v1/chat/completions", status: 405, allow: "POST",
			contains: `{"error":{"message":"method GET is not allowed on /v1/chat/completions (allowed: POST)","type":"invalid_request_error","param":null,"code":"method_not_allowed"}}`},
		{name: "GET on completions", method: "GET", path: "/v1/completions", status: 405, allow: "POST", contains: "method_not_allowed"},
		{name: "POST on a model", method: "POST", path: "/v1/models/chat", status: 405, allow: "GET", contains: "method_not_allowed"},
		{name: "a deployment on its defaults", method: "GET", path: "/admin/deployments/chat", status: 200, contains: `"spec":{},` + defaults},
		{name: "deployments list their defaults", method: "GET", path: "/admin/deployments", status: 200, contains: defaults},
		{"completions reach the activator", "POST", "/v1/completions", `{}`, 200, `"ok":true`, ""},
		{"chat reaches the activator", "POST", "/v1/chat/completions", `{}`, 200, `"ok":true`, ""},
		{"list deployments", "GET", "/admin/deployments", "", 200, `"revision":"sha256:a"`, ""},
		{"get a deployment", "GET", "/admin/deployments/chat", "", 200, `"name":"chat"`, ""},
		{"a deployment's live status", "GET", "/admin/deployments/chat", "", 200, `"status":{"ready":2,"pending":0,"draining":0,"desired":2,"panic":false,"reason":"concurrency: stable avg 9.0 / target 8 → 2","last_cold_start":"t2"}`, ""},
		{"missing deployment", "GET", "/admin/deployments/nope", "", 404, "model_not_found", ""},
		{"update a spec", "PUT", "/admin/deployments/chat", `{"spec":{"replicas":{"min":1,"max":3}}}`, 200, `"max":3`, ""},
		{"bad spec", "PUT", "/admin/deployments/chat", `{"replicas":{"min":5,"max":3}}`, 400, "replicas.max", ""},
		{"bad JSON", "PUT", "/admin/deployments/chat", `{`, 400, `"error"`, ""},
		{"an updated spec's effective spec", "PUT", "/admin/deployments/chat", `{"spec":{"replicas":{"min":1,"max":3}}}`, 200,
			`"spec":{"replicas":{"min":1,"max":3}},"effective_spec":{"replicas":{"min":1,"max":3,"sleeping":3},"target_concurrency":8,`, ""},
		{"unknown route", "GET", "/v2/nothing", "", 404, `{"error":{"message":"no route GET /v2/nothing","type":"not_found_error","param":null,"code":"not_found"}}`, ""},
		{"wrong method", "DELETE", "/v1/models", "", 405, `"code":"method_not_allowed"`, "GET"},
		{"runtimes without a manager", "GET", "/admin/runtimes", "", 404, `"error"`, ""},
		{"metrics", "GET", "/metrics", "", 200, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, h := do(tc.method, tc.path, tc.body)
			if status != tc.status || !strings.Contains(body, tc.contains) || h.Get("Allow") != tc.allow {
				t.Fatalf("%s %s: %d %s (Allow %q), want %d containing %q (Allow %q)", tc.method, tc.path, status, body, h.Get("Allow"), tc.status, tc.contains, tc.allow)
			}
			if h.Get("X-Request-Id") == "" {
				t.Fatal("no X-Request-Id")
			}
		})
	}

	// The OpenAI SDK's models.retrieve, with a name that holds a slash.
	client := oai.NewClient(option.WithBaseURL(ts.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	m, err := client.Models.Get(ctx, "org/name")
	if err != nil || m.ID != "org/name" || m.OwnedBy != "stoke" || m.Created == 0 {
		t.Fatalf("SDK models.retrieve: %+v, %v", m, err)
	}
	var apiErr *oai.Error
	if _, err := client.Models.Get(ctx, "nope"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Fatalf("SDK models.retrieve of an unknown model: %v", err)
	}
}

// TestNewServesInferenceAlone builds the API with only an inference
// handler, as a data-path benchmark does: mounting the admin routes must
// not need the deployments they act on.
func TestNewServesInferenceAlone(t *testing.T) {
	inference := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"ok":true}`)
	})
	srv := httptest.NewServer(New(Options{Inference: inference}))
	defer srv.Close()
	resp, body := send(t, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{}`), nil)
	if resp.StatusCode != http.StatusOK || body != `{"ok":true}` {
		t.Fatalf("POST /v1/completions: %d %s", resp.StatusCode, body)
	}
}

// lateAdapters is a follower's view of chat's adapters: it learns of
// "late" only when asked to refresh.
type lateAdapters struct {
	storeDeployments
	refreshed atomic.Int32
}

func (l *lateAdapters) Adapters(name string) []string {
	if name == "chat" && l.refreshed.Load() > 0 {
		return []string{"sql", "late"}
	}
	return l.storeDeployments.Adapters(name)
}

func (l *lateAdapters) Refresh(context.Context) { l.refreshed.Add(1) }

// TestRetrieveAdapterRefreshes: GET /v1/models/BASE:ADAPTER on a gateway
// whose view trails the state reads it again before its 404, as the
// activator does, so an adapter just pushed is retrievable at once; a
// known one reads nothing.
func TestRetrieveAdapterRefreshes(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.PutDeployment(ctx, store.Deployment{Name: "chat", Revision: "sha256:a"}); err != nil {
		t.Fatal(err)
	}
	late := &lateAdapters{storeDeployments: storeDeployments{st}}
	ts := httptest.NewServer(New(Options{Deployments: late, Registry: prometheus.NewRegistry()}))
	defer ts.Close()
	for _, c := range []struct {
		path      string
		status    int
		refreshes int32
	}{
		{"/v1/models/chat:sql", 200, 0},
		{"/v1/models/chat:late", 200, 1},
		{"/v1/models/chat:nope", 404, 1},
	} {
		before := late.refreshed.Load()
		resp, body := send(t, "GET", ts.URL+c.path, nil, nil)
		if resp.StatusCode != c.status || late.refreshed.Load()-before != c.refreshes {
			t.Errorf("GET %s = %d %s after %d refreshes, want %d after %d", c.path, resp.StatusCode, body, late.refreshed.Load()-before, c.status, c.refreshes)
		}
	}
}
