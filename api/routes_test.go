package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
)

// storeRoutes is a RouteAdmin over a real state store: the file's routes
// and providers, read-only, plus the routes stored through the API.
type storeRoutes struct {
	st   *store.Store
	file config.Routes
}

func (s storeRoutes) Routes() config.Routes {
	rs := config.Routes{Routes: slices.Clone(s.file.Routes), Providers: s.file.Providers}
	stored, err := s.st.Routes(context.Background())
	if err != nil {
		panic(err)
	}
	for _, sr := range stored {
		r, err := config.ParseRoute(sr.Spec)
		if err != nil {
			panic(err)
		}
		rs.Routes = append(rs.Routes, r)
	}
	// RouteAdmin's contract: ordered by name.
	slices.SortFunc(rs.Routes, func(a, b config.Route) int { return strings.Compare(a.Name, b.Name) })
	rs.Providers = slices.Clone(rs.Providers)
	slices.SortFunc(rs.Providers, func(a, b config.Provider) int { return strings.Compare(a.Name, b.Name) })
	return rs
}

func (s storeRoutes) FromFile(name string) bool {
	return slices.ContainsFunc(s.file.Routes, func(r config.Route) bool { return r.Name == name })
}

func (s storeRoutes) PutRoute(ctx context.Context, r config.Route) error {
	if s.FromFile(r.Name) {
		return fmt.Errorf("put route %s: %w", r.Name, config.ErrRouteFromFile)
	}
	rs := s.Routes()
	rs.Routes = slices.DeleteFunc(rs.Routes, func(o config.Route) bool { return o.Name == r.Name })
	rs.Routes = append(rs.Routes, r)
	isDeployment := func(name string) bool { _, err := s.st.Deployment(ctx, name); return err == nil }
	if err := rs.Validate(isDeployment); err != nil {
		return fmt.Errorf("%w: %w", config.ErrRouteInvalid, err)
	}
	spec, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = s.st.PutRoute(ctx, r.Name, spec)
	return err
}

func (s storeRoutes) DeleteRoute(ctx context.Context, name string) error {
	if s.FromFile(name) {
		return fmt.Errorf("delete route %s: %w", name, config.ErrRouteFromFile)
	}
	return s.st.DeleteRoute(ctx, name)
}

// routesServer serves the API with deployments chat and org/big and the
// file route fast (→ chat) with provider openai; mw run before handlers.
func routesServer(t *testing.T, mw ...gin.HandlerFunc) (*httptest.Server, *store.Store) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, name := range []string{"chat", "org/big"} {
		if err := st.PutDeployment(ctx, store.Deployment{Name: name, Revision: "sha256:a"}); err != nil {
			t.Fatal(err)
		}
	}
	file, err := config.ParseRoutesYAML([]byte(`
routes:
  - name: fast
    split: [{to: chat, weight: 1}]
    fallbacks: [openai]
providers:
  - name: openai
    base_url: https://api.openai.com/v1
    model: gpt-4o-mini
    api_key_env: OPENAI_API_KEY
`))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(Options{
		Inference:   http.NotFoundHandler(),
		Deployments: storeDeployments{st},
		Registry:    prometheus.NewRegistry(),
		Routes:      storeRoutes{st: st, file: file},
		Middleware:  mw,
	}))
	t.Cleanup(ts.Close)
	return ts, st
}

// call makes one request and returns its status and body.
func call(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	resp, b := send(t, method, url, strings.NewReader(body), nil)
	return resp.StatusCode, b
}

func TestAdminRoutes(t *testing.T) {
	ts, st := routesServer(t)
	// The steps run in order, each on the state the ones before left.
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		contains                 []string
		lacks                    []string
	}{
		{name: "list the file's route and providers", method: "GET", path: "/admin/routes", status: 200, contains: []string{
			`{"object":"list","data":[{"name":"fast","split":[{"to":"chat","weight":1}],"fallbacks":["openai"],"source":"file"}],`,
			`"providers":[{"name":"openai","base_url":"https://api.openai.com/v1","model":"gpt-4o-mini","api_key_env":"OPENAI_API_KEY"}]}`}},
		{name: "get the file's route", method: "GET", path: "/admin/routes/fast", status: 200,
			contains: []string{`{"name":"fast","split":[{"to":"chat","weight":1}],"fallbacks":["openai"],"source":"file"}`}},
		{name: "put a route named with a slash, no name in the body", method: "PUT", path: "/admin/routes/org/smart",
			body:     `{"rules":[{"match":{"min_prompt_tokens":1000},"to":"org/big"}],"split":[{"to":"chat","weight":90},{"to":"fast","weight":10}],"fallback_after":"2s"}`,
			status:   200,
			contains: []string{`{"name":"org/smart","rules":[{"match":{"min_prompt_tokens":1000},"to":"org/big"}],"split":[{"to":"chat","weight":90},{"to":"fast","weight":10}],"fallback_after":"2s","source":"api"}`}},
		{name: "get it back", method: "GET", path: "/admin/routes/org/smart", status: 200,
			contains: []string{`"name":"org/smart"`, `"fallback_after":"2s"`, `"source":"api"`}},
		{name: "get it back, slash escaped", method: "GET", path: "/admin/routes/org%2Fsmart", status: 200,
			contains: []string{`"name":"org/smart"`}},
		{name: "replace it, the body naming it", method: "PUT", path: "/admin/routes/org/smart",
			body: `{"name":"org/smart","split":[{"to":"org/big","weight":1}]}`, status: 200,
			contains: []string{`{"name":"org/smart","split":[{"to":"org/big","weight":1}],"source":"api"}`}},
		{name: "the list has both, by name", method: "GET", path: "/admin/routes", status: 200,
			contains: []string{`"data":[{"name":"fast",`, `"source":"file"},{"name":"org/smart","split":[{"to":"org/big","weight":1}],"source":"api"}]`}},
		{name: "a body naming another route", method: "PUT", path: "/admin/routes/org/smart",
			body: `{"name":"other","split":[{"to":"chat","weight":1}]}`, status: 400,
			contains: []string{`"type":"invalid_request_error","param":"name"`, `differs from the path's`}},
		{name: "a body whose name is not a string", method: "PUT", path: "/admin/routes/org/smart",
			body: `{"name":7,"split":[{"to":"chat","weight":1}]}`, status: 400, contains: []string{`"param":"name"`}},
		{name: "an unknown field", method: "PUT", path: "/admin/routes/r",
			body: `{"split":[{"to":"chat","weight":1}],"fallbak":["openai"]}`, status: 400,
			contains: []string{`"message":"route r: fallbak: unknown field"`, `"type":"invalid_request_error"`}},
		{name: "an unknown field inside a rule", method: "PUT", path: "/admin/routes/r",
			body: `{"rules":[{"match":{"regexp":"x"},"to":"chat"}],"split":[{"to":"chat","weight":1}]}`, status: 400,
			contains: []string{`rules[0].match.regexp: unknown field`}},
		{name: "a bad regex", method: "PUT", path: "/admin/routes/r",
			body: `{"rules":[{"match":{"regex":"(unclosed"},"to":"chat"}],"split":[{"to":"chat","weight":1}]}`, status: 400,
			contains: []string{`rules[0].match.regex: error parsing regexp`}},
		{name: "no split", method: "PUT", path: "/admin/routes/r", body: `{}`, status: 400, contains: []string{`split: at least one target`}},
		{name: "a target that is nothing", method: "PUT", path: "/admin/routes/r",
			body: `{"split":[{"to":"ghost","weight":1}]}`, status: 400, contains: []string{`\"ghost\" is neither a deployment nor a route`}},
		{name: "a route named like a deployment", method: "PUT", path: "/admin/routes/chat",
			body: `{"split":[{"to":"org/big","weight":1}]}`, status: 400, contains: []string{`a deployment has that name`}},
		{name: "a loop", method: "PUT", path: "/admin/routes/fast2",
			body: `{"split":[{"to":"fast2","weight":1}]}`, status: 400, contains: []string{`routes loop`}},
		{name: "bad JSON", method: "PUT", path: "/admin/routes/r", body: `{`, status: 400, contains: []string{`"error"`}},
		{name: "not an object", method: "PUT", path: "/admin/routes/r", body: `[1]`, status: 400, contains: []string{`"error"`}},
		{name: "null", method: "PUT", path: "/admin/routes/r", body: `null`, status: 400, contains: []string{`must be a JSON object`}},
		{name: "put over the file's route", method: "PUT", path: "/admin/routes/fast",
			body: `{"split":[{"to":"org/big","weight":1}]}`, status: 409,
			contains: []string{`"type":"conflict_error","param":null,"code":"route_from_file"`}},
		{name: "delete the file's route", method: "DELETE", path: "/admin/routes/fast", status: 409,
			contains: []string{`"code":"route_from_file"`}},
		{name: "get an unknown route", method: "GET", path: "/admin/routes/nope", status: 404,
			contains: []string{`{"error":{"message":"route nope does not exist","type":"not_found_error","param":null,"code":"route_not_found"}}`}},
		{name: "a prefix of a route is unknown", method: "GET", path: "/admin/routes/org", status: 404, contains: []string{`"code":"route_not_found"`}},
		{name: "delete an unknown route", method: "DELETE", path: "/admin/routes/nope", status: 404, contains: []string{`"code":"route_not_found"`}},
		{name: "delete without a name", method: "DELETE", path: "/admin/routes/", status: 404, contains: []string{`"code":"route_not_found"`}},
		{name: "delete the API's route", method: "DELETE", path: "/admin/routes/org/smart", status: 200,
			contains: []string{`{"deleted":true,"id":"org/smart","object":"route"}`}},
		{name: "it is gone", method: "GET", path: "/admin/routes/org/smart", status: 404, contains: []string{`"code":"route_not_found"`}},
		{name: "the list has the file's alone", method: "GET", path: "/admin/routes", status: 200,
			contains: []string{`"data":[{"name":"fast",`}, lacks: []string{`org/smart`}},
		{name: "a method the routes do not take", method: "POST", path: "/admin/routes/r", status: 405, contains: []string{`"code":"method_not_allowed"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, tc.method, ts.URL+tc.path, tc.body)
			if status != tc.status {
				t.Errorf("%s %s = %d, want %d: %s", tc.method, tc.path, status, tc.status, body)
			}
			for _, want := range tc.contains {
				if !strings.Contains(body, want) {
					t.Errorf("%s %s body = %s\nwant it to contain %s", tc.method, tc.path, body, want)
				}
			}
			for _, bad := range tc.lacks {
				if strings.Contains(body, bad) {
					t.Errorf("%s %s body = %s\nwant no %s", tc.method, tc.path, body, bad)
				}
			}
		})
	}
	// What the API put and took out is what the store holds.
	rs, err := st.Routes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 0 {
		t.Errorf("stored routes after the delete = %+v, want none", rs)
	}
}

func TestAdminRoutesBodyLimit(t *testing.T) {
	ts, _ := routesServer(t)
	big := `{"split":[{"to":"chat","weight":1}],"fallbacks":["` + strings.Repeat("x", 2<<20) + `"]}`
	status, body := call(t, "PUT", ts.URL+"/admin/routes/r", big)
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(body, "request_too_large") {
		t.Errorf("PUT of a 2 MiB route = %d %s, want 413 request_too_large", status, body)
	}
}

func TestModelsListRoutes(t *testing.T) {
	ts, _ := routesServer(t)
	if status, body := call(t, "PUT", ts.URL+"/admin/routes/org/smart", `{"split":[{"to":"chat","weight":1}]}`); status != 200 {
		t.Fatalf("put org/smart = %d %s", status, body)
	}
	status, body := call(t, "GET", ts.URL+"/v1/models", "")
	if status != 200 {
		t.Fatalf("GET /v1/models = %d %s", status, body)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	var got []string
	for _, m := range list.Data {
		got = append(got, m.ID+" "+m.OwnedBy)
		if m.OwnedBy == "stoke-route" && (m.Created != 0 || m.Object != "model") {
			t.Errorf("route model %+v, want object model, created 0", m)
		}
	}
	// Deployments first (by name), then routes (by name).
	want := []string{"chat stoke", "chat:sql stoke", "org/big stoke", "fast stoke-route", "org/smart stoke-route"}
	if !slices.Equal(got, want) {
		t.Errorf("GET /v1/models ids = %q, want %q", got, want)
	}

	for _, tc := range []struct {
		path     string
		status   int
		contains string
	}{
		{"/v1/models/fast", 200, `{"id":"fast","object":"model","created":0,"owned_by":"stoke-route"}`},
		{"/v1/models/org/smart", 200, `{"id":"org/smart","object":"model","created":0,"owned_by":"stoke-route"}`},
		{"/v1/models/chat", 200, `"owned_by":"stoke"}`},
		{"/v1/models/nope", 404, `"code":"model_not_found"`},
	} {
		if status, body := call(t, "GET", ts.URL+tc.path, ""); status != tc.status || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s = %d %s, want %d with %s", tc.path, status, body, tc.status, tc.contains)
		}
	}
}

func TestModelsScopeRoutes(t *testing.T) {
	scoped := func(c *gin.Context) {
		p := tenancy.Principal{TenantID: "t", KeyID: "k", Models: []string{"chat", "fast"}}
		c.Request = c.Request.WithContext(tenancy.WithPrincipal(c.Request.Context(), p))
		c.Next()
	}
	ts, st := routesServer(t, scoped)
	if _, err := st.PutRoute(context.Background(), "hidden", json.RawMessage(`{"name":"hidden","split":[{"to":"chat","weight":1}]}`)); err != nil {
		t.Fatal(err)
	}
	status, body := call(t, "GET", ts.URL+"/v1/models", "")
	if status != 200 {
		t.Fatalf("GET /v1/models = %d %s", status, body)
	}
	for _, want := range []string{`"id":"chat"`, `"id":"fast"`} {
		if !strings.Contains(body, want) {
			t.Errorf("scoped /v1/models = %s, want %s", body, want)
		}
	}
	for _, bad := range []string{`"id":"hidden"`, `"id":"org/big"`} {
		if strings.Contains(body, bad) {
			t.Errorf("scoped /v1/models = %s, want no %s (outside the key's scope)", body, bad)
		}
	}
	if status, body := call(t, "GET", ts.URL+"/v1/models/hidden", ""); status != 404 || !strings.Contains(body, "model_not_found") {
		t.Errorf("scoped GET /v1/models/hidden = %d %s, want 404 model_not_found", status, body)
	}
	if status, body := call(t, "GET", ts.URL+"/v1/models/fast", ""); status != 200 || !strings.Contains(body, `"owned_by":"stoke-route"`) {
		t.Errorf("scoped GET /v1/models/fast = %d %s, want 200", status, body)
	}
}

func TestNoRouteAdmin(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ts := httptest.NewServer(New(Options{Inference: http.NotFoundHandler(), Deployments: storeDeployments{st}}))
	defer ts.Close()
	if status, body := call(t, "GET", ts.URL+"/admin/routes", ""); status != 404 || !strings.Contains(body, `"code":"not_found"`) {
		t.Errorf("GET /admin/routes without Routes = %d %s, want 404 not_found", status, body)
	}
	if status, body := call(t, "GET", ts.URL+"/v1/models", ""); status != 200 || body != `{"object":"list","data":[]}` {
		t.Errorf("GET /v1/models without Routes = %d %s, want an empty list", status, body)
	}
}
