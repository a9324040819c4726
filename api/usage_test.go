package api

import (
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/internal/store"
)

// Headers of usageAuth, the test's stand-in for authentication (beside
// tenantHeader).
const (
	adminHeader  = "X-Test-Admin"
	modelsHeader = "X-Test-Models"
)

// usageAuth puts in the request's context the principal the test headers
// name: the admin's (adminHeader), a tenant's (tenantHeader, its key
// scoped to the comma-separated modelsHeader), or none.
func usageAuth(c *gin.Context) {
	var p tenancy.Principal
	switch {
	case c.GetHeader(adminHeader) != "":
		p.Admin = true
	case c.GetHeader(tenantHeader) != "":
		p.TenantID, p.KeyID = c.GetHeader(tenantHeader), "key-"+c.GetHeader(tenantHeader)
		if m := c.GetHeader(modelsHeader); m != "" {
			p.Models = strings.Split(m, ",")
		}
	default:
		return
	}
	c.Request = c.Request.WithContext(tenancy.WithPrincipal(c.Request.Context(), p))
}

// usageFixture is a state store with two tenants (acme and globex) and
// usage records of theirs, of no tenant, and of a tenant deleted since,
// over three UTC days; and a tenancy service on it.
type usageFixture struct {
	st         *store.Store
	svc        *tenancy.Service
	acme, glob string // the tenants' ids
}

func newUsageFixture(t *testing.T, adminKey string) usageFixture {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc, err := tenancy.New(ctx, tenancy.Options{Store: st, AdminKey: adminKey})
	if err != nil {
		t.Fatal(err)
	}
	f := usageFixture{st: st, svc: svc}
	for _, name := range []string{"acme", "globex", "gone"} {
		tn, err := svc.CreateTenant(ctx, name, tenancy.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		switch name {
		case "acme":
			f.acme = tn.ID
		case "globex":
			f.glob = tn.ID
		default:
			defer func() {
				if err := svc.DeleteTenant(ctx, tn.ID); err != nil {
					t.Fatal(err)
				}
			}()
		}
	}
	at := func(d, h int) time.Time { return time.Date(2025, 3, d, h, 0, 0, 0, time.UTC) }
	n := 0
	rec := func(tenant, model string, when time.Time, prompt, completion, cached int) store.UsageRecord {
		n++
		return store.UsageRecord{RequestID: fmt.Sprintf("req-%d", n), TenantID: tenant, KeyID: "key", Model: model, Status: 200,
			PromptTokens: prompt, CompletionTokens: completion, CachedTokens: cached, CreatedAt: when}
	}
	if err := st.InsertUsage(ctx, []store.UsageRecord{
		rec(f.acme, "chat", at(1, 1), 10, 1, 0),
		rec(f.acme, "chat", at(1, 23), 20, 2, 5),
		rec(f.acme, "embed", at(2, 3), 30, 0, 0),
		rec(f.acme, "chat", at(3, 4), 40, 4, 0),
		rec(f.glob, "chat", at(1, 5), 50, 5, 1),
		rec(f.glob, "chat", at(3, 6), 60, 6, 2),
		rec("", "chat", at(2, 7), 70, 7, 0),
		rec("tnt_deleted", "chat", at(2, 8), 80, 8, 0),
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

// usageClient asks a usage endpoint with the test's headers.
type usageClient struct {
	t       *testing.T
	url     string
	headers map[string]string
}

// get sends GET path and returns the status and body.
func (c usageClient) get(path string) (int, string) {
	c.t.Helper()
	resp, b := send(c.t, http.MethodGet, c.url+path, nil, c.headers)
	if resp.StatusCode == http.StatusOK {
		ct := resp.Header.Get("Content-Type")
		if strings.Contains(path, "format=csv") != strings.HasPrefix(ct, "text/csv") {
			c.t.Errorf("GET %s: Content-Type %q", path, ct)
		}
	}
	return resp.StatusCode, b
}

// list is the JSON answer of path, which must be a 200 list.
func (c usageClient) list(path string) []usageObject {
	c.t.Helper()
	status, body := c.get(path)
	var out struct {
		Object string          `json:"object"`
		Data   json.RawMessage `json:"data"`
	}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil || out.Object != "list" || string(out.Data) == "null" {
		c.t.Fatalf("GET %s = %d %s: want a 200 list", path, status, body)
	}
	var data []usageObject
	if err := json.Unmarshal(out.Data, &data); err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	if !ordered(data) {
		c.t.Errorf("GET %s: totals not by day, tenant and model:\n%v", path, data)
	}
	return data
}

// csvList is the CSV answer of path read with encoding/csv, which must
// have the header row and a full row per total.
func (c usageClient) csvList(path string) []usageObject {
	c.t.Helper()
	status, body := c.get(path)
	if status != http.StatusOK {
		c.t.Fatalf("GET %s = %d %s", path, status, body)
	}
	rows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil || len(rows) == 0 || strings.Join(rows[0], ",") != strings.Join(usageCSVHeader, ",") {
		c.t.Fatalf("GET %s: %v, CSV %q: want the header row first", path, err, body)
	}
	data := []usageObject{}
	for _, r := range rows[1:] {
		n := make([]int64, 4)
		for i := range n {
			if n[i], err = strconv.ParseInt(r[4+i], 10, 64); err != nil {
				c.t.Fatalf("GET %s: row %q: %v", path, r, err)
			}
		}
		data = append(data, usageObject{TenantID: r[0], Tenant: r[1], Model: r[2], Day: r[3], Requests: int(n[0]),
			PromptTokens: n[1], CompletionTokens: n[2], CachedTokens: n[3]})
	}
	return data
}

// both is the JSON answer of path, after checking that its CSV answer
// holds the very same totals.
func (c usageClient) both(path string) []usageObject {
	c.t.Helper()
	data := c.list(path)
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	if got := c.csvList(path + sep + "format=csv"); fmt.Sprint(got) != fmt.Sprint(data) {
		c.t.Errorf("GET %s: CSV\n%v\nJSON\n%v", path, got, data)
	}
	if got := c.list(path + sep + "format=json"); fmt.Sprint(got) != fmt.Sprint(data) {
		c.t.Errorf("GET %s with format=json: %v, without %v", path, got, data)
	}
	return data
}

// rows shows totals one per line as "day tenant_id(tenant) model requests
// prompt completion cached", sorted (tenant ids are random: the answers'
// own order is checked apart, by ordered).
func rows(data []usageObject) string {
	var lines []string
	for _, u := range data {
		lines = append(lines, fmt.Sprintf("%s %s(%s) %s %d %d %d %d\n", u.Day, u.TenantID, u.Tenant, u.Model, u.Requests, u.PromptTokens,
			u.CompletionTokens, u.CachedTokens))
	}
	return sortLines(strings.Join(lines, ""))
}

// sortLines sorts the lines of s.
func sortLines(s string) string {
	lines := strings.SplitAfter(s, "\n")
	slices.Sort(lines)
	return strings.Join(lines, "")
}

// ordered reports whether data is in the store's order: by day, tenant id
// and model, each total once.
func ordered(data []usageObject) bool {
	return slices.IsSortedFunc(data, func(a, b usageObject) int {
		return cmp.Or(cmp.Compare(a.Day, b.Day), cmp.Compare(a.TenantID, b.TenantID), cmp.Compare(a.Model, b.Model))
	}) && len(slices.CompactFunc(slices.Clone(data), func(a, b usageObject) bool {
		return a.Day == b.Day && a.TenantID == b.TenantID && a.Model == b.Model
	})) == len(data)
}

// wantUsageError checks an OpenAI-shaped 400 blaming param.
func wantUsageError(t *testing.T, c usageClient, path, param string) {
	t.Helper()
	status, body := c.get(path)
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	if status != http.StatusBadRequest || json.Unmarshal([]byte(body), &e) != nil || e.Error.Type != "invalid_request_error" ||
		e.Error.Param == nil || *e.Error.Param != param || !strings.Contains(e.Error.Message, param) {
		t.Errorf("GET %s = %d %s: want a 400 invalid_request_error on %s", path, status, body, param)
	}
}

func TestUsageEndpoints(t *testing.T) {
	f := newUsageFixture(t, "")
	srv := httptest.NewServer(New(Options{Deployments: storeDeployments{f.st}, Tenancy: f.svc, Auth: AuthNone,
		Middleware: []gin.HandlerFunc{usageAuth}}))
	t.Cleanup(srv.Close)
	admin := usageClient{t, srv.URL, map[string]string{adminHeader: "1"}}
	acme := usageClient{t, srv.URL, map[string]string{tenantHeader: f.acme}}
	glob := usageClient{t, srv.URL, map[string]string{tenantHeader: f.glob}}
	none := usageClient{t, srv.URL, nil}
	a, g := f.acme+"(acme)", f.glob+"(globex)"

	allRows := `2025-03-01 ` + a + ` chat 2 30 3 5
2025-03-01 ` + g + ` chat 1 50 5 1
2025-03-02 () chat 1 70 7 0
2025-03-02 ` + a + ` embed 1 30 0 0
2025-03-02 tnt_deleted() chat 1 80 8 0
2025-03-03 ` + a + ` chat 1 40 4 0
2025-03-03 ` + g + ` chat 1 60 6 2
`
	acmeRows := `2025-03-01 ` + a + ` chat 2 30 3 5
2025-03-02 ` + a + ` embed 1 30 0 0
2025-03-03 ` + a + ` chat 1 40 4 0
`
	for _, c := range []struct {
		name   string
		client usageClient
		path   string
		want   string
	}{
		// The admin sees every tenant, names beside ids (none for no
		// tenant, or a tenant deleted since).
		{"admin: all", admin, "/admin/usage", allRows},
		{"admin: one tenant by id", admin, "/admin/usage?tenant=" + f.acme, acmeRows},
		{"admin: one tenant by name", admin, "/admin/usage?tenant=acme", acmeRows},
		{"admin: a deleted tenant's id", admin, "/admin/usage?tenant=tnt_deleted", "2025-03-02 tnt_deleted() chat 1 80 8 0\n"},
		{"admin: unknown tenant", admin, "/admin/usage?tenant=nobody", ""},
		{"admin: one model", admin, "/admin/usage?model=embed", "2025-03-02 " + a + " embed 1 30 0 0\n"},
		{"admin: days, both included", admin, "/admin/usage?since=2025-03-02&until=2025-03-02&tenant=" + f.acme, "2025-03-02 " + a + " embed 1 30 0 0\n"},
		{"admin: since", admin, "/admin/usage?since=2025-03-03&model=chat&tenant=globex", "2025-03-03 " + g + " chat 1 60 6 2\n"},
		{"admin: until", admin, "/admin/usage?until=2025-03-01&tenant=acme", "2025-03-01 " + a + " chat 2 30 3 5\n"},
		{"admin: past the records", admin, "/admin/usage?since=2025-04-01", ""},
		// A tenant sees its own only.
		{"acme", acme, "/v1/usage", acmeRows},
		{"acme: model", acme, "/v1/usage?model=chat&since=2025-03-01&until=2025-03-03", "2025-03-01 " + a + " chat 2 30 3 5\n2025-03-03 " + a + " chat 1 40 4 0\n"},
		{"acme: another's model", acme, "/v1/usage?model=other", ""},
		{"globex", glob, "/v1/usage", "2025-03-01 " + g + " chat 1 50 5 1\n2025-03-03 " + g + " chat 1 60 6 2\n"},
		{"a tenant of no usage", usageClient{t, srv.URL, map[string]string{tenantHeader: "tnt_new"}}, "/v1/usage", ""},
		// A key scoped to models sees their totals only.
		{"acme, key scoped to chat", usageClient{t, srv.URL, map[string]string{tenantHeader: f.acme, modelsHeader: "chat"}}, "/v1/usage",
			"2025-03-01 " + a + " chat 2 30 3 5\n2025-03-03 " + a + " chat 1 40 4 0\n"},
		// No principal (auth off) is the owner "": its records only.
		{"no tenant", none, "/v1/usage", "2025-03-02 () chat 1 70 7 0\n"},
		// The admin key on /v1 has no tenant either.
		{"admin on /v1", admin, "/v1/usage", "2025-03-02 () chat 1 70 7 0\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.client.t = t
			if got := rows(c.client.both(c.path)); got != sortLines(c.want) {
				t.Errorf("GET %s:\n%s\nwant:\n%s", c.path, got, c.want)
			}
		})
	}

	// Every total the admin sees adds up to the records.
	var requests int
	var prompt int64
	for _, u := range admin.list("/admin/usage") {
		requests, prompt = requests+u.Requests, prompt+u.PromptTokens
	}
	if requests != 8 || prompt != 360 {
		t.Errorf("admin totals: %d requests, %d prompt tokens; want 8, 360", requests, prompt)
	}

	// A tenant can neither name another tenant nor read /admin/usage.
	wantUsageError(t, acme, "/v1/usage?tenant="+f.glob, "tenant")
	wantUsageError(t, acme, "/v1/usage?tenant=", "tenant")
	wantUsageError(t, acme, "/v1/usage?tenant="+f.acme, "tenant")
	for _, c := range []usageClient{acme, glob} {
		status, body := c.get("/admin/usage?tenant=" + f.glob)
		if status != http.StatusUnauthorized || !strings.Contains(body, "invalid_api_key") || strings.Contains(body, "globex") {
			t.Errorf("a tenant's GET /admin/usage = %d %s, want 401 invalid_api_key", status, body)
		}
	}

	// Bad parameters are 400s in OpenAI's shape.
	for _, c := range []usageClient{admin, acme} {
		base := "/admin/usage"
		if c.headers[adminHeader] == "" {
			base = "/v1/usage"
		}
		for _, bad := range []struct{ query, param string }{
			{"since=yesterday", "since"},
			{"since=2025-3-1", "since"},
			{"since=2025-02-30", "since"},
			{"until=2025-03-01T00:00:00Z", "until"},
			{"until=" + strings.Repeat("9", 1000), "until"},
			{"since=2025-03-02&until=2025-03-01", "until"},
			{"format=xml", "format"},
		} {
			wantUsageError(t, c, base+"?"+bad.query, bad.param)
		}
	}
	if _, body := admin.get("/admin/usage?until=" + strings.Repeat("9", 1000)); len(body) > 600 {
		t.Errorf("a long bad value is echoed whole: %d bytes", len(body))
	}
}

// TestUsageEndpointsWithKeys runs the usage endpoints behind the real
// auth middleware: a tenant key reads its own tenant's usage on /v1 and is
// refused on /admin; the admin key reads everyone's; no key, nothing.
func TestUsageEndpointsWithKeys(t *testing.T) {
	const adminKey = "usage-admin-key-0123456789"
	f := newUsageFixture(t, adminKey)
	ctx := context.Background()
	_, key, err := f.svc.CreateKey(ctx, tenancy.KeyRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Options{Deployments: storeDeployments{f.st}, Tenancy: f.svc, Auth: AuthKeys}))
	t.Cleanup(srv.Close)
	bearer := func(k string) map[string]string { return map[string]string{"Authorization": "Bearer " + k} }
	tenant := usageClient{t, srv.URL, bearer(key)}
	admin := usageClient{t, srv.URL, bearer(adminKey)}

	own := tenant.both("/v1/usage")
	if len(own) != 3 {
		t.Fatalf("acme's key sees %d totals, want 3:\n%s", len(own), rows(own))
	}
	for _, u := range own {
		if u.TenantID != f.acme || u.Tenant != "acme" {
			t.Fatalf("acme's key sees another tenant's total %+v", u)
		}
	}
	if all := admin.both("/admin/usage"); len(all) != 7 {
		t.Fatalf("the admin sees %d totals, want 7:\n%s", len(all), rows(all))
	}
	for _, c := range []struct {
		client usageClient
		path   string
		status int
	}{
		{tenant, "/admin/usage", http.StatusUnauthorized},
		{tenant, "/v1/usage?tenant=" + f.glob, http.StatusBadRequest},
		{usageClient{t, srv.URL, nil}, "/v1/usage", http.StatusUnauthorized},
		{usageClient{t, srv.URL, nil}, "/admin/usage", http.StatusUnauthorized},
		{usageClient{t, srv.URL, bearer("sk-stoke-made-up")}, "/v1/usage", http.StatusUnauthorized},
	} {
		if status, body := c.client.get(c.path); status != c.status || strings.Contains(body, "globex") {
			t.Errorf("GET %s = %d %s, want %d", c.path, status, body, c.status)
		}
	}
}

func TestUsageCSVQuotes(t *testing.T) {
	data := []usageObject{{TenantID: "tnt_1", Tenant: "a, \"quoted\"\nname", Model: "org/model", Day: "2025-03-01", Requests: 1, PromptTokens: 2}}
	b, err := usageCSV(data)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := csv.NewReader(strings.NewReader(string(b))).ReadAll()
	if err != nil || len(rs) != 2 || rs[1][1] != data[0].Tenant || strings.Join(rs[1][4:], ",") != "1,2,0,0" {
		t.Fatalf("CSV %q read back as %q, %v", b, rs, err)
	}
}
