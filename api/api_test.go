package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

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

// Status reports a fixed live state for chat, as a controller with two
// ready replicas would.
func (s storeDeployments) Status(name string) (reconcile.Status, bool) {
	if name != "chat" {
		return reconcile.Status{}, false
	}
	return reconcile.Status{Ready: 2, Desired: 2, Reason: "concurrency: stable avg 9.0 / target 8 → 2", LastColdStart: tier.Cache}, true
}

func TestAPI(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.PutDeployment(ctx, store.Deployment{Name: "chat", Revision: "sha256:a"}); err != nil {
		t.Fatal(err)
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
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		contains                 string
	}{
		{"models", "GET", "/v1/models", "", 200, `"id":"chat"`},
		{"completions reach the activator", "POST", "/v1/completions", `{}`, 200, `"ok":true`},
		{"chat reaches the activator", "POST", "/v1/chat/completions", `{}`, 200, `"ok":true`},
		{"list deployments", "GET", "/admin/deployments", "", 200, `"revision":"sha256:a"`},
		{"get a deployment", "GET", "/admin/deployments/chat", "", 200, `"name":"chat"`},
		{"a deployment's live status", "GET", "/admin/deployments/chat", "", 200, `"status":{"ready":2,"pending":0,"draining":0,"desired":2,"panic":false,"reason":"concurrency: stable avg 9.0 / target 8 → 2","last_cold_start":"t2"}`},
		{"missing deployment", "GET", "/admin/deployments/nope", "", 404, "model_not_found"},
		{"update a spec", "PUT", "/admin/deployments/chat", `{"spec":{"replicas":{"min":1,"max":3}}}`, 200, `"max":3`},
		{"bad spec", "PUT", "/admin/deployments/chat", `{"replicas":{"min":5,"max":3}}`, 400, "replicas.max"},
		{"bad JSON", "PUT", "/admin/deployments/chat", `{`, 400, `"error"`},
		{"unknown route", "GET", "/v2/nothing", "", 404, `"error"`},
		{"wrong method", "DELETE", "/v1/models", "", 404, `"error"`},
		{"runtimes without a manager", "GET", "/admin/runtimes", "", 404, `"error"`},
		{"metrics", "GET", "/metrics", "", 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, h := do(tc.method, tc.path, tc.body)
			if status != tc.status || !strings.Contains(body, tc.contains) {
				t.Fatalf("%s %s: %d %s, want %d containing %q", tc.method, tc.path, status, body, tc.status, tc.contains)
			}
			if h.Get("X-Request-Id") == "" {
				t.Fatal("no X-Request-Id")
			}
		})
	}
}
