package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/api"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/scaler/reconcile"
)

func TestSplitString(t *testing.T) {
	for _, tc := range []struct {
		split []config.Weighted
		want  string
	}{
		{[]config.Weighted{{To: "a", Weight: 90}, {To: "b", Weight: 10}}, "a 90%, b 10%"},
		{[]config.Weighted{{To: "chat", Weight: 1}}, "chat 100%"},
		{[]config.Weighted{{To: "a", Weight: 2}, {To: "b", Weight: 1}}, "a 66.7%, b 33.3%"},
		{[]config.Weighted{{To: "a", Weight: 1}, {To: "b", Weight: 1}, {To: "org/c", Weight: 2}}, "a 25%, b 25%, org/c 50%"},
		{nil, ""},
	} {
		if got := splitString(tc.split); got != tc.want {
			t.Errorf("splitString(%v) = %q, want %q", tc.split, got, tc.want)
		}
	}
}

func TestRouteTable(t *testing.T) {
	var b strings.Builder
	err := routeTable(&b, []api.RouteJSON{
		{Route: config.Route{Name: "fast", Split: []config.Weighted{{To: "chat", Weight: 1}}, Fallbacks: []string{"big", "openai"}}, Source: "file"},
		{Route: config.Route{Name: "org/smart", Rules: []config.Rule{{To: "big"}, {To: "chat"}},
			Split: []config.Weighted{{To: "a", Weight: 9}, {To: "b", Weight: 1}}}, Source: "api"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "" +
		"NAME       SOURCE  DEFAULT       RULES  FALLBACKS\n" +
		"fast       file    chat 100%     0      big, openai\n" +
		"org/smart  api     a 90%, b 10%  2      -\n"
	if b.String() != want {
		t.Errorf("routeTable =\n%s\nwant\n%s", b.String(), want)
	}
}

func TestRouteFileJSON(t *testing.T) {
	for _, tc := range []struct {
		name, file, want, err string
	}{
		{name: "YAML", file: "split:\n  - {to: chat, weight: 90}\n  - {to: big, weight: 10}\nfallback_after: 2s\n",
			want: `{"fallback_after":"2s","split":[{"to":"chat","weight":90},{"to":"big","weight":10}]}`},
		{name: "JSON", file: `{"name":"r","split":[{"to":"chat","weight":1}]}`, want: `{"name":"r","split":[{"to":"chat","weight":1}]}`},
		{name: "unknown fields are left to the server", file: "splt: []\n", want: `{"splt":[]}`},
		{name: "empty", file: "", err: "empty"},
		{name: "a list", file: "- name: a\n", err: "want one route (a mapping)"},
		{name: "a string", file: "chat\n", err: "want one route (a mapping)"},
		{name: "bad YAML", file: "split: [\n", err: "yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := routeFileJSON([]byte(tc.file))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("routeFileJSON = %s, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("routeFileJSON = %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}

func TestRoutePath(t *testing.T) {
	for name, want := range map[string]string{
		"chat":      "/admin/routes/chat",
		"org/name":  "/admin/routes/org/name",
		"a b?c#d/e": "/admin/routes/a%20b%3Fc%23d/e",
	} {
		if got := routePath(name); got != want {
			t.Errorf("routePath(%q) = %q, want %q", name, got, want)
		}
	}
}

// cliDeployments serves deployments from a real state store (api.Deployments).
type cliDeployments struct{ *store.Store }

func (d cliDeployments) UpdateSpec(ctx context.Context, name string, spec json.RawMessage) (store.Deployment, error) {
	return store.Deployment{}, openai.Unsupported("spec", "not in this test")
}

func (d cliDeployments) Status(string) (reconcile.Status, bool) { return reconcile.Status{}, false }

func (d cliDeployments) Promote(context.Context, string) (store.Rollout, error) {
	return store.Rollout{}, reconcile.ErrNoCanary
}

func (d cliDeployments) Rollback(context.Context, string) (store.Rollout, error) {
	return store.Rollout{}, reconcile.ErrNoCanary
}

func (d cliDeployments) Pin(context.Context, string, string) (store.Deployment, error) {
	return store.Deployment{}, openai.Unsupported("revision", "not in this test")
}

func (d cliDeployments) Unpin(context.Context, string) (store.Deployment, error) {
	return store.Deployment{}, openai.Unsupported("revision", "not in this test")
}

// cliRoutes is an api.RouteAdmin over a real state store: the file's
// routes, read-only, plus those stored.
type cliRoutes struct {
	st   *store.Store
	file []config.Route
}

func (r cliRoutes) Routes() config.Routes {
	rs := config.Routes{Routes: slices.Clone(r.file)}
	stored, err := r.st.Routes(context.Background())
	if err != nil {
		panic(err)
	}
	for _, s := range stored {
		rt, err := config.ParseRoute(s.Spec)
		if err != nil {
			panic(err)
		}
		rs.Routes = append(rs.Routes, rt)
	}
	return rs
}

func (r cliRoutes) FromFile(name string) bool {
	return slices.ContainsFunc(r.file, func(rt config.Route) bool { return rt.Name == name })
}

func (r cliRoutes) PutRoute(ctx context.Context, rt config.Route) error {
	if r.FromFile(rt.Name) {
		return config.ErrRouteFromFile
	}
	rs := r.Routes()
	rs.Routes = append(slices.DeleteFunc(rs.Routes, func(o config.Route) bool { return o.Name == rt.Name }), rt)
	if err := rs.Validate(func(name string) bool { _, err := r.st.Deployment(ctx, name); return err == nil }); err != nil {
		return fmt.Errorf("%w: %w", config.ErrRouteInvalid, err)
	}
	spec, err := json.Marshal(rt)
	if err != nil {
		return err
	}
	_, err = r.st.PutRoute(ctx, rt.Name, spec)
	return err
}

func (r cliRoutes) DeleteRoute(ctx context.Context, name string) error {
	if r.FromFile(name) {
		return config.ErrRouteFromFile
	}
	return r.st.DeleteRoute(ctx, name)
}

// TestRouteCLI drives `stoke route list|get|set|delete` over HTTP against
// the admin API (api.New with a store-backed RouteAdmin behind an admin
// key): a route set from YAML round trips, a name with a slash works, the
// server's refusals come back in one line, and the admin key is sent.
func TestRouteCLI(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, name := range []string{"chat", "big"} {
		if err := st.PutDeployment(ctx, store.Deployment{Name: name, Revision: "sha256:a"}); err != nil {
			t.Fatal(err)
		}
	}
	const adminKey = "stoke-admin-route-test"
	requireKey := func(c *gin.Context) {
		if c.GetHeader("Authorization") != "Bearer "+adminKey {
			e := &openai.Error{Status: http.StatusUnauthorized, Message: "admin key required", Type: openai.TypeInvalidRequest, Code: "invalid_api_key"}
			c.AbortWithStatusJSON(e.Status, e.Body())
			return
		}
		c.Next()
	}
	file := []config.Route{{Name: "fast", Split: []config.Weighted{{To: "chat", Weight: 1}}}}
	ts := httptest.NewServer(api.New(api.Options{
		Inference:   http.NotFoundHandler(),
		Deployments: cliDeployments{st},
		Routes:      cliRoutes{st: st, file: file},
		Middleware:  []gin.HandlerFunc{requireKey},
	}))
	defer ts.Close()

	dir := t.TempDir()
	writeFile := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyFile := writeFile("admin-key", adminKey+"\n")
	route := func(args ...string) (string, error) {
		t.Helper()
		stdout, _, err := batchCLI(t, append(append([]string{"route"}, args...), "--url", ts.URL, "--admin-key-file", keyFile)...)
		if strings.Contains(stdout, adminKey) {
			t.Fatalf("the admin key is printed:\n%s", stdout)
		}
		return stdout, err
	}

	smart := writeFile("smart.yaml", `
rules:
  - match: {min_prompt_tokens: 4000}
    to: big
split:
  - {to: chat, weight: 90}
  - {to: fast, weight: 10}
fallbacks: [big]
fallback_after: 2s
`)
	if out, err := route("set", "org/smart", "--file", smart); err != nil || out != "org/smart\n" {
		t.Fatalf("route set org/smart: %v\n%s", err, out)
	}
	stored, err := st.Routes(ctx)
	if err != nil || len(stored) != 1 || stored[0].Name != "org/smart" {
		t.Fatalf("stored routes after set = %+v, %v; want org/smart", stored, err)
	}

	out, err := route("list")
	if err != nil || !strings.HasPrefix(out, "NAME") {
		t.Fatalf("route list: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[1]), " ") != "fast file chat 100% 0 -" ||
		strings.Join(strings.Fields(lines[2]), " ") != "org/smart api chat 90%, fast 10% 1 big" {
		t.Fatalf("route list:\n%s", out)
	}

	out, err = route("list", "--json")
	var list api.RouteListJSON
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || list.Object != "list" || len(list.Data) != 2 || list.Providers == nil {
		t.Fatalf("route list --json: %v\n%s", err, out)
	}

	out, err = route("get", "org/smart")
	var got api.RouteJSON
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.Name != "org/smart" || got.Source != "api" ||
		len(got.Rules) != 1 || got.Rules[0].Match.MinPromptTokens != 4000 || time.Duration(got.FallbackAfter) != 2*time.Second || !strings.Contains(out, "\n  \"split\": [") {
		t.Fatalf("route get org/smart: %v\n%s", err, out)
	}

	// JSON from standard input, replacing the route, with --json.
	cmd := newRootCmd()
	var stdout strings.Builder
	cmd.SetArgs([]string{"route", "set", "org/smart", "-f", "-", "--json", "--url", ts.URL, "--admin-key-file", keyFile})
	cmd.SetIn(strings.NewReader(`{"name":"org/smart","split":[{"to":"big","weight":1}]}`))
	cmd.SetOut(&stdout)
	cmd.SetErr(&strings.Builder{})
	if err := cmd.ExecuteContext(ctx); err != nil || stdout.String() != `{"name":"org/smart","split":[{"to":"big","weight":1}],"source":"api"}`+"\n" {
		t.Fatalf("route set -f - --json: %v\n%s", err, stdout.String())
	}

	// The server's refusals, in one line each.
	for _, tc := range []struct {
		what   string
		args   []string
		status int
		code   string
		msg    string
	}{
		{"an unknown field", []string{"set", "r", "--file", writeFile("typo.yaml", "split: [{to: chat, weight: 1}]\nfallbak: [big]\n")}, 400, "", "fallbak: unknown field"},
		{"a bad regex", []string{"set", "r", "--file", writeFile("re.yaml", "rules: [{match: {regex: '(x'}, to: big}]\nsplit: [{to: chat, weight: 1}]\n")}, 400, "", "regex"},
		{"another name in the file", []string{"set", "r", "--file", writeFile("named.yaml", "name: other\nsplit: [{to: chat, weight: 1}]\n")}, 400, "", "differs"},
		{"a target that is nothing", []string{"set", "r", "--file", writeFile("ghost.yaml", "split: [{to: ghost, weight: 1}]\n")}, 400, "", "ghost"},
		{"the file's route", []string{"set", "fast", "--file", writeFile("fast.yaml", "split: [{to: big, weight: 1}]\n")}, 409, "route_from_file", ""},
		{"deleting the file's route", []string{"delete", "fast"}, 409, "route_from_file", ""},
		{"getting an unknown route", []string{"get", "nope"}, 404, "route_not_found", ""},
	} {
		_, err := route(tc.args...)
		wantAdminError(t, tc.what, err, tc.status, tc.code)
		if !strings.HasPrefix(err.Error(), "route "+tc.args[0]+" ") || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: error %q, want it to start %q and contain %q", tc.what, err, "route "+tc.args[0], tc.msg)
		}
	}
	if _, err := route("set", "r"); err == nil || !strings.Contains(err.Error(), "--file is required") {
		t.Errorf("route set without --file: %v", err)
	}
	if _, err := route("set", "r", "--file", writeFile("list.yaml", "- a\n")); err == nil || !strings.Contains(err.Error(), "want one route") {
		t.Errorf("route set of a YAML list: %v", err)
	}

	if out, err := route("delete", "org/smart"); err != nil || out != "org/smart\n" {
		t.Fatalf("route delete org/smart: %v\n%s", err, out)
	}
	_, err = route("delete", "org/smart")
	wantAdminError(t, "route delete twice", err, 404, "route_not_found")
	if stored, err := st.Routes(ctx); err != nil || len(stored) != 0 {
		t.Fatalf("stored routes after delete = %+v, %v; want none", stored, err)
	}

	// The key from $STOKE_ADMIN_KEY works; a wrong one is refused.
	t.Setenv(adminKeyEnv, adminKey)
	if out, _, err := batchCLI(t, "route", "list", "--url", ts.URL); err != nil || !strings.Contains(out, "fast") {
		t.Fatalf("route list with $%s: %v\n%s", adminKeyEnv, err, out)
	}
	t.Setenv(adminKeyEnv, "wrong")
	_, _, err = batchCLI(t, "route", "list", "--url", ts.URL)
	wantAdminError(t, "route list with a wrong key", err, 401, "invalid_api_key")
}
