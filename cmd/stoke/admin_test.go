package main

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// wantAdminError checks that err is one line and an answer of the server
// with this status and code (any code when code is "").
func wantAdminError(t *testing.T, what string, err error, status int, code string) {
	t.Helper()
	var ae *adminError
	if err == nil || strings.Contains(err.Error(), "\n") || !errors.As(err, &ae) || ae.Status != status || code != "" && ae.Code != code {
		t.Fatalf("%s: error %v (%#v), want one line of an HTTP %d %s", what, err, ae, status, code)
	}
}

// modelsStatus is the status of GET /v1/models with key as the bearer
// token, and the code of its error.
func modelsStatus(t *testing.T, base, key string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, answerError(resp.StatusCode, raw, false).Code
}

// TestAdminCLI drives `stoke admin tenant|key …` against a real `stoke
// serve` whose admin key is in a file: tenants round trip, a key is shown
// once (list shows its hint only), works on /v1 until it is revoked or its
// tenant deleted, and a wrong admin key is refused in one line.
func TestAdminCLI(t *testing.T) {
	if newServeCmd().Flags().Lookup("admin-key-file") == nil {
		t.Skip("stoke serve has no --admin-key-file yet (issue 15's server side); re-run once it lands")
	}
	dir := t.TempDir()
	const adminKey = "stoke-admin-test-5f2c9a17e3b84d06"
	keyFile := filepath.Join(dir, "admin-key")
	// The first line is the key; what follows is ignored.
	if err := os.WriteFile(keyFile, []byte(adminKey+"\nnot the key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	base := startServe(t, []string{adminKeyEnv + "="}, "--data", data, "--warm", "0", "--admin-key-file", keyFile)

	probe, err := http.NewRequest(http.MethodPost, base+"/admin/tenants", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	probe.Header.Set("Authorization", "Bearer "+adminKey)
	probe.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(probe)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		t.Skip("POST /admin/tenants answers 404: stoke serve has no tenant admin API yet (issue 15's server side); re-run once it lands")
	}

	admin := func(args ...string) (stdout, stderr string, err error) {
		t.Helper()
		return batchCLI(t, append(append([]string{"admin"}, args...), "--url", base, "--admin-key-file", keyFile)...)
	}
	noAdminKey := func(s string) {
		t.Helper()
		if strings.Contains(s, adminKey) {
			t.Fatalf("the admin key is printed:\n%s", s)
		}
	}

	// Tenants.
	stdout, stderr, err := admin("tenant", "create", "acme")
	tid := strings.TrimSpace(stdout)
	if err != nil || !strings.HasPrefix(tid, "tnt_") || strings.Contains(tid, "\n") {
		t.Fatalf("tenant create: %v, stdout %q, stderr %q: want one tenant id", err, stdout, stderr)
	}
	_, _, err = admin("tenant", "create", "acme")
	wantAdminError(t, "tenant create of a name taken", err, http.StatusConflict, "tenant_exists")
	if !strings.HasPrefix(err.Error(), "admin tenant create: ") {
		t.Fatalf("tenant create of a name taken: %q", err)
	}
	stdout, _, err = admin("tenant", "list")
	if err != nil || !strings.Contains(stdout, tid) || !strings.Contains(stdout, "acme") || !strings.HasPrefix(stdout, "ID") {
		t.Fatalf("tenant list: %v\n%s", err, stdout)
	}
	var tenants struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object, Name string
		} `json:"data"`
	}
	if stdout, _, err = admin("tenant", "list", "--json"); err != nil || json.Unmarshal([]byte(stdout), &tenants) != nil ||
		tenants.Object != "list" || len(tenants.Data) != 1 || tenants.Data[0].ID != tid || tenants.Data[0].Name != "acme" {
		t.Fatalf("tenant list --json: %v\n%s", err, stdout)
	}

	// A key is printed alone on stdout, once.
	stdout, stderr, err = admin("key", "create", "--tenant", "acme", "--name", "ci")
	key := strings.TrimSuffix(stdout, "\n")
	if err != nil || !strings.HasPrefix(key, "sk-stoke-") || strings.ContainsAny(key, "\n ") {
		t.Fatalf("key create: %v, stdout %q: want the key alone", err, stdout)
	}
	if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "shown once") || strings.Contains(stderr, key) {
		t.Fatalf("key create's note %q: want one line saying the key is shown once, without it", stderr)
	}
	noAdminKey(stdout + stderr)

	// Another, scoped and expiring, as JSON.
	stdout, _, err = admin("key", "create", "--tenant", tid, "--models", "chat,other", "--expires-in", "720h", "--json")
	var scoped apiKeyObject
	if err != nil || json.Unmarshal([]byte(stdout), &scoped) != nil || !strings.HasPrefix(scoped.Key, "sk-stoke-") ||
		scoped.TenantID != tid || strings.Join(scoped.Models, ",") != "chat,other" || scoped.ExpiresAt == nil || scoped.RevokedAt != nil {
		t.Fatalf("key create --json: %v\n%s", err, stdout)
	}
	if d := time.Until(time.Unix(*scoped.ExpiresAt, 0)); d < 719*time.Hour || d > 721*time.Hour {
		t.Fatalf("key create --expires-in 720h: expires in %v", d)
	}
	if _, _, err := admin("key", "create", "--tenant", tid, "--expires-in", "soon"); err == nil || !strings.Contains(err.Error(), "--expires-in") {
		t.Fatalf("key create --expires-in soon: %v", err)
	}

	// The list shows hints, never keys.
	var keys struct {
		Data []apiKeyObject `json:"data"`
	}
	stdout, _, err = admin("key", "list", "--tenant", tid, "--json")
	if err != nil || json.Unmarshal([]byte(stdout), &keys) != nil || len(keys.Data) != 2 || strings.Contains(stdout, key) || strings.Contains(stdout, scoped.Key) {
		t.Fatalf("key list --json: %v\n%s", err, stdout)
	}
	var ci apiKeyObject
	for _, k := range keys.Data {
		if k.Name == "ci" {
			ci = k
		}
	}
	if ci.ID == "" || ci.Hint == "" || ci.Key != "" || !strings.HasPrefix(ci.Hint, "sk-stoke-") || ci.RevokedAt != nil {
		t.Fatalf("key list --json has no active key ci with a hint:\n%s", stdout)
	}
	stdout, _, err = admin("key", "list")
	if err != nil || !strings.Contains(stdout, ci.ID) || !strings.Contains(stdout, ci.Hint) || !strings.Contains(stdout, "active") ||
		strings.Contains(stdout, key) || strings.Contains(stdout, scoped.Key) {
		t.Fatalf("key list:\n%s", stdout)
	}

	// The key works on /v1 until it is revoked; a made-up one never does.
	if code, _ := modelsStatus(t, base, key); code != http.StatusOK {
		t.Fatalf("GET /v1/models with the new key: %d", code)
	}
	if code, errCode := modelsStatus(t, base, "sk-stoke-madeup"); code != http.StatusUnauthorized || errCode != "invalid_api_key" {
		t.Fatalf("GET /v1/models with a made-up key: %d %s, want 401 invalid_api_key", code, errCode)
	}
	stdout, _, err = admin("key", "revoke", ci.ID)
	if err != nil || !strings.HasPrefix(stdout, ci.ID+" revoked at ") {
		t.Fatalf("key revoke: %v\n%s", err, stdout)
	}
	if code, errCode := modelsStatus(t, base, key); code != http.StatusUnauthorized || errCode != "invalid_api_key" {
		t.Fatalf("GET /v1/models with the revoked key: %d %s, want 401 invalid_api_key", code, errCode)
	}
	if stdout, _, err = admin("key", "list", "--json"); err != nil || json.Unmarshal([]byte(stdout), &keys) != nil {
		t.Fatalf("key list --json: %v\n%s", err, stdout)
	}
	for _, k := range keys.Data {
		if k.ID == ci.ID && k.RevokedAt == nil {
			t.Fatalf("key list --json after revoke: %s has no revoked_at\n%s", ci.ID, stdout)
		}
	}
	if stdout, _, _ = admin("key", "list", "--tenant", tid); !strings.Contains(stdout, "revoked") {
		t.Fatalf("key list after revoke shows no revoked key:\n%s", stdout)
	}

	// A wrong admin key, or none, is refused in one line, and no key is
	// ever echoed.
	code, msg := stokeProcess(t, []string{adminKeyEnv + "=not-the-admin-key"}, 30*time.Second, "admin", "tenant", "list", "--url", base)
	wantOneLineError(t, code, msg, "stoke: admin tenant list: ", "")
	noAdminKey(msg)
	code, msg = stokeProcess(t, []string{adminKeyEnv + "="}, 30*time.Second, "admin", "key", "list", "--url", base)
	wantOneLineError(t, code, msg, "stoke: admin key list: ", "no admin key given")
	t.Setenv(adminKeyEnv, "not-the-admin-key")
	_, _, err = batchCLI(t, "admin", "tenant", "list", "--url", base)
	wantAdminError(t, "tenant list with a wrong admin key", err, http.StatusUnauthorized, "invalid_api_key")
	// A tenant's key is no admin key.
	_, _, err = batchCLI(t, "admin", "tenant", "list", "--url", base, "--admin-key", scoped.Key)
	wantAdminError(t, "tenant list with a tenant's key", err, http.StatusUnauthorized, "invalid_api_key")

	// Deleting the tenant takes its keys with it.
	if code, _ := modelsStatus(t, base, scoped.Key); code != http.StatusOK {
		t.Fatalf("GET /v1/models with the scoped key: %d", code)
	}
	if stdout, _, err = admin("tenant", "delete", tid); err != nil || strings.TrimSpace(stdout) != tid {
		t.Fatalf("tenant delete: %v\n%s", err, stdout)
	}
	if code, _ := modelsStatus(t, base, scoped.Key); code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/models with a key of a deleted tenant: %d, want 401", code)
	}
	if stdout, _, err = admin("tenant", "list"); err != nil || strings.Contains(stdout, tid) {
		t.Fatalf("tenant list after delete: %v\n%s", err, stdout)
	}
	_, _, err = admin("tenant", "delete", tid)
	wantAdminError(t, "tenant delete of a deleted tenant", err, http.StatusNotFound, "")
	code, msg = stokeProcess(t, nil, 30*time.Second, "admin", "tenant", "delete", tid, "--url", base, "--admin-key-file", keyFile)
	wantOneLineError(t, code, msg, "stoke: admin tenant delete "+tid+": ", "")
}

// fakeAdminKey is the admin key of fakeAdmin.
const fakeAdminKey = "adm-fake-7f3e91"

// fakeAdmin is an /admin server of canned answers that records the
// Authorization header of each request.
type fakeAdmin struct {
	mu    sync.Mutex
	auths []string
}

func (f *fakeAdmin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("Authorization") != "Bearer "+fakeAdminKey {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"message":"Incorrect admin key:\nnot this one.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)
		return
	}
	switch r.Method + " " + r.URL.Path {
	case "POST /admin/keys":
		fmt.Fprint(w, `{"id":"key_1","object":"api_key","tenant_id":"tnt_1","name":"","hint":"sk-stoke-AbCd…wxyz","models":[],"created_at":1,"expires_at":null,"revoked_at":null,"key":"sk-stoke-AbCdSECRETwxyz"}`)
	case "GET /admin/keys":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"key_1","object":"api_key","tenant_id":"tnt_1","name":"","hint":"sk-stoke-AbCd…wxyz","models":[],"created_at":1,"expires_at":null,"revoked_at":2}]}`)
	default:
		http.NotFound(w, r)
	}
}

// requests is how many requests came, and the Authorization header of the
// last one.
func (f *fakeAdmin) requests() (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.auths) == 0 {
		return 0, ""
	}
	return len(f.auths), f.auths[len(f.auths)-1]
}

// TestAdminCLIClient checks the client's side on a fake server: where the
// admin key comes from (and that --help never shows it), what key create
// prints where, and errors in one line that never hold the admin key.
func TestAdminCLIClient(t *testing.T) {
	fake := &fakeAdmin{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyFile, emptyFirst := file("key", fakeAdminKey+"\r\nsecond line\n"), file("empty", "\n"+fakeAdminKey+"\n")
	wantAuth := func(what string, err error) {
		t.Helper()
		if _, auth := fake.requests(); err != nil || auth != "Bearer "+fakeAdminKey {
			t.Fatalf("%s: %v, Authorization %q", what, err, auth)
		}
	}

	t.Setenv(adminKeyEnv, fakeAdminKey)
	help, _, err := batchCLI(t, "admin", "key", "create", "--help")
	if err != nil || !strings.Contains(help, "$"+adminKeyEnv) || strings.Contains(help, fakeAdminKey) {
		t.Fatalf("--help: %v\n%s", err, help)
	}

	// The key alone on stdout; the admin key from $STOKE_ADMIN_KEY.
	stdout, stderr, err := batchCLI(t, "admin", "key", "create", "--tenant", "acme", "--url", srv.URL)
	wantAuth("key create", err)
	if stdout != "sk-stoke-AbCdSECRETwxyz\n" {
		t.Fatalf("key create printed %q, want the key alone", stdout)
	}
	if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "key_1") || !strings.Contains(stderr, "shown once") || strings.Contains(stderr, "SECRET") {
		t.Fatalf("key create's note: %q", stderr)
	}
	stdout, _, err = batchCLI(t, "admin", "key", "list", "--url", srv.URL)
	wantAuth("key list", err)
	if !strings.Contains(stdout, "sk-stoke-AbCd…wxyz") || !strings.Contains(stdout, "revoked") || !strings.Contains(stdout, "never") {
		t.Fatalf("key list:\n%s", stdout)
	}

	// The file's first line and --admin-key each win over the variable.
	t.Setenv(adminKeyEnv, "wrong")
	_, _, err = batchCLI(t, "admin", "key", "list", "--url", srv.URL, "--admin-key-file", keyFile)
	wantAuth("--admin-key-file", err)
	_, _, err = batchCLI(t, "admin", "key", "list", "--url", srv.URL, "--admin-key", fakeAdminKey)
	wantAuth("--admin-key", err)

	// Mistakes, each one line, the server's message folded.
	unreachable := "http://" + freeAddr(t)
	for _, tc := range []struct {
		name, url string
		args      []string
		want      string
	}{
		{"wrong key", srv.URL, []string{"key", "list"}, "admin key list: Incorrect admin key: not this one."},
		{"both flags", srv.URL, []string{"key", "list", "--admin-key", fakeAdminKey, "--admin-key-file", keyFile}, "give one of them"},
		{"empty first line", srv.URL, []string{"key", "list", "--admin-key-file", emptyFirst}, "the first line is empty"},
		{"missing file", srv.URL, []string{"key", "list", "--admin-key-file", filepath.Join(dir, "nope")}, "nope"},
		{"no tenant", srv.URL, []string{"key", "create"}, "--tenant is required"},
		{"bad expiry", srv.URL, []string{"key", "create", "--tenant", "acme", "--expires-in", "-1h"}, "--expires-in"},
		{"no route", srv.URL, []string{"tenant", "list", "--admin-key", fakeAdminKey}, "admin tenant list: HTTP 404 Not Found"},
		{"unreachable", unreachable, []string{"tenant", "list"}, "admin tenant list: cannot reach stoke serve at " + unreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := batchCLI(t, append(append([]string{"admin"}, tc.args...), "--url", tc.url)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), fakeAdminKey) {
				t.Fatalf("error %v, want one line containing %q", err, tc.want)
			}
		})
	}

	// No key at all: no Authorization header, and the 401 says how to
	// give one.
	t.Setenv(adminKeyEnv, "")
	before, _ := fake.requests()
	_, _, err = batchCLI(t, "admin", "key", "list", "--url", srv.URL)
	after, auth := fake.requests()
	if err == nil || !strings.Contains(err.Error(), "no admin key given") || after != before+1 || auth != "" {
		t.Fatalf("no admin key: %v, Authorization %q", err, auth)
	}
}

// completeWithKey sends a short completion with key as the bearer token
// and returns the tokens its answer's usage counts.
func completeWithKey(t *testing.T, base, key, prompt string) (promptTokens, completionTokens int64) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/completions",
		strings.NewReader(`{"model":"chat","prompt":`+strconv.Quote(prompt)+`,"max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &body) != nil || body.Usage.PromptTokens == 0 || body.Usage.CompletionTokens == 0 {
		t.Fatalf("completion: %d %s", resp.StatusCode, raw)
	}
	return body.Usage.PromptTokens, body.Usage.CompletionTokens
}

// TestAdminUsageCLI drives `stoke admin usage` against a real `stoke
// serve` on sim engines: the completions a tenant's key sent are counted,
// to the token, the same in the table, --json and --csv; --tenant,
// --model and the days filter; mistakes are one line.
func TestAdminUsageCLI(t *testing.T) {
	if newServeCmd().Flags().Lookup("admin-key-file") == nil {
		t.Skip("stoke serve has no --admin-key-file yet (issue 15's server side)")
	}
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\n")
	const adminKey = "stoke-admin-usage-3b7d0c19a4e6"
	keyFile := filepath.Join(t.TempDir(), "admin-key")
	if err := os.WriteFile(keyFile, []byte(adminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	base := startServe(t, []string{adminKeyEnv + "="}, "--data", data, "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
		"--warm", "0", "--slots", "1", "--sim-profile", "llama-3.1-8b-fp8-h100", "--admin-key-file", keyFile)
	admin := func(args ...string) (stdout, stderr string, err error) {
		t.Helper()
		return batchCLI(t, append(append([]string{"admin"}, args...), "--url", base, "--admin-key-file", keyFile)...)
	}

	stdout, _, err := admin("tenant", "create", "acme")
	tid := strings.TrimSpace(stdout)
	if err != nil || tid == "" {
		t.Fatalf("tenant create: %v %q", err, stdout)
	}
	stdout, _, err = admin("key", "create", "--tenant", "acme")
	key := strings.TrimSpace(stdout)
	if err != nil || !strings.HasPrefix(key, "sk-stoke-") {
		t.Fatalf("key create: %v", err)
	}
	// Before any request: no usage, the header alone.
	if stdout, _, err = admin("usage", "--csv"); err != nil || strings.TrimSpace(stdout) != "tenant_id,tenant,model,day,requests,prompt_tokens,completion_tokens,cached_tokens" {
		t.Fatalf("usage --csv of no usage: %v\n%s", err, stdout)
	}
	waitUntil(t, "chat has a ready replica", 60*time.Second, func() bool { return readyWithAdminKey(base, adminKey, "chat") })

	const sent = 3
	var wantPrompt, wantCompletion int64
	for i := range sent {
		p, c := completeWithKey(t, base, key, fmt.Sprintf("usage request %d", i))
		wantPrompt, wantCompletion = wantPrompt+p, wantCompletion+c
	}
	// One with the admin key: usage of no tenant.
	completeWithKey(t, base, adminKey, "the operator's request")

	type total struct {
		TenantID         string `json:"tenant_id"`
		Tenant           string `json:"tenant"`
		Model            string `json:"model"`
		Day              string `json:"day"`
		Requests         int64  `json:"requests"`
		PromptTokens     int64  `json:"prompt_tokens"`
		CompletionTokens int64  `json:"completion_tokens"`
		CachedTokens     int64  `json:"cached_tokens"`
	}
	// sums adds the totals up per tenant id (a run across midnight UTC
	// has two days).
	sums := func(ts []total) map[string]total {
		out := map[string]total{}
		for _, u := range ts {
			s := out[u.TenantID]
			if u.Model != "chat" || u.TenantID == tid && u.Tenant != "acme" || u.TenantID == "" && u.Tenant != "" {
				t.Fatalf("total %+v: want model chat and the tenant's name", u)
			}
			if _, err := time.Parse("2006-01-02", u.Day); err != nil {
				t.Fatalf("total %+v: day %v", u, err)
			}
			s.Requests += u.Requests
			s.PromptTokens += u.PromptTokens
			s.CompletionTokens += u.CompletionTokens
			s.CachedTokens += u.CachedTokens
			out[u.TenantID] = s
		}
		return out
	}
	asJSON := func(args ...string) []total {
		t.Helper()
		stdout, _, err := admin(append([]string{"usage", "--json"}, args...)...)
		var list struct {
			Object string  `json:"object"`
			Data   []total `json:"data"`
		}
		if err != nil || json.Unmarshal([]byte(stdout), &list) != nil || list.Object != "list" {
			t.Fatalf("usage --json %v: %v\n%s", args, err, stdout)
		}
		return list.Data
	}
	asCSV := func(args ...string) []total {
		t.Helper()
		stdout, _, err := admin(append([]string{"usage", "--csv"}, args...)...)
		if err != nil {
			t.Fatalf("usage --csv %v: %v", args, err)
		}
		rows, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
		if err != nil || len(rows) == 0 || strings.Join(rows[0], ",") != "tenant_id,tenant,model,day,requests,prompt_tokens,completion_tokens,cached_tokens" {
			t.Fatalf("usage --csv %v: %v\n%s", args, err, stdout)
		}
		out := []total{}
		for _, r := range rows[1:] {
			u := total{TenantID: r[0], Tenant: r[1], Model: r[2], Day: r[3]}
			for i, p := range []*int64{&u.Requests, &u.PromptTokens, &u.CompletionTokens, &u.CachedTokens} {
				if *p, err = strconv.ParseInt(r[4+i], 10, 64); err != nil {
					t.Fatalf("usage --csv %v: row %q: %v", args, r, err)
				}
			}
			out = append(out, u)
		}
		return out
	}

	all := asJSON()
	got := sums(all)
	if a := got[tid]; a.Requests != sent || a.PromptTokens != wantPrompt || a.CompletionTokens != wantCompletion {
		t.Fatalf("usage --json: acme %+v, want %d requests, %d prompt and %d completion tokens\n%+v", a, sent, wantPrompt, wantCompletion, all)
	}
	if n := got[""]; n.Requests != 1 || len(got) != 2 {
		t.Fatalf("usage --json: %+v, want acme's and one request of no tenant", got)
	}
	if c := asCSV(); fmt.Sprint(c) != fmt.Sprint(all) {
		t.Fatalf("usage --csv\n%+v\nusage --json\n%+v", c, all)
	}
	for _, by := range []string{tid, "acme"} {
		only := asJSON("--tenant", by)
		if s := sums(only); len(s) != 1 || s[tid] != got[tid] {
			t.Fatalf("usage --json --tenant %s: %+v", by, only)
		}
		if c := asCSV("--tenant", by); fmt.Sprint(c) != fmt.Sprint(only) {
			t.Fatalf("usage --csv --tenant %s: %+v, JSON %+v", by, c, only)
		}
	}
	today := time.Now().UTC()
	if d := asJSON("--model", "chat", "--since", today.AddDate(0, 0, -1).Format("2006-01-02"), "--until", today.AddDate(0, 0, 1).Format("2006-01-02")); fmt.Sprint(d) != fmt.Sprint(all) {
		t.Fatalf("usage of chat from yesterday to tomorrow: %+v, want %+v", d, all)
	}
	for _, args := range [][]string{{"--model", "other"}, {"--since", today.AddDate(0, 0, 2).Format("2006-01-02")}, {"--tenant", "nobody"}} {
		if d := asJSON(args...); len(d) != 0 {
			t.Fatalf("usage --json %v: %+v, want none", args, d)
		}
	}

	// The table: a row per total and their total.
	stdout, _, err = admin("usage")
	if err != nil || !strings.HasPrefix(stdout, "DAY") || !strings.Contains(stdout, tid) || !strings.Contains(stdout, "acme") {
		t.Fatalf("usage: %v\n%s", err, stdout)
	}
	last := strings.Fields(strings.TrimSpace(stdout[strings.LastIndex(strings.TrimSpace(stdout), "\n")+1:]))
	if len(last) != 5 || last[0] != "TOTAL" || last[1] != strconv.Itoa(sent+1) {
		t.Fatalf("usage's last row %q: want TOTAL and %d requests\n%s", last, sent+1, stdout)
	}

	// The tenant's own key reads its own usage on /v1, and no admin's.
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var own struct{ Data []total }
	json.NewDecoder(resp.Body).Decode(&own)
	resp.Body.Close()
	if s := sums(own.Data); resp.StatusCode != http.StatusOK || len(s) != 1 || s[tid] != got[tid] {
		t.Fatalf("GET /v1/usage with acme's key: %d %+v", resp.StatusCode, own.Data)
	}
	if _, _, err := batchCLI(t, "admin", "usage", "--url", base, "--admin-key", key); err == nil {
		t.Fatal("usage with a tenant's key: no error")
	}

	// Mistakes, one line each.
	_, _, err = admin("usage", "--since", "last-week")
	wantAdminError(t, "usage --since last-week", err, http.StatusBadRequest, "")
	if !strings.HasPrefix(err.Error(), "admin usage: ") || !strings.Contains(err.Error(), "since") {
		t.Fatalf("usage --since last-week: %q", err)
	}
	if _, _, err = admin("usage", "--csv", "--json"); err == nil || !strings.Contains(err.Error(), "give one of them") {
		t.Fatalf("usage --csv --json: %v", err)
	}
	code, msg := stokeProcess(t, nil, 30*time.Second, "admin", "usage", "--until", "2025-02-30", "--url", base, "--admin-key-file", keyFile)
	wantOneLineError(t, code, msg, "stoke: admin usage: ", "until")
}

func TestAdminUsageTable(t *testing.T) {
	var b strings.Builder
	if err := usageTable(&b, nil); err != nil || strings.TrimSpace(b.String()) != "DAY  TENANT  NAME  MODEL  REQUESTS  PROMPT_TOKENS  COMPLETION_TOKENS  CACHED_TOKENS" {
		t.Fatalf("no usage: %v %q", err, b.String())
	}
	b.Reset()
	one := usageTotal{TenantID: "tnt_1", Tenant: "acme", Model: "chat", Day: "2025-03-01", Requests: 2, PromptTokens: 10, CompletionTokens: 4, CachedTokens: 1}
	if err := usageTable(&b, []usageTotal{one}); err != nil || strings.Contains(b.String(), "TOTAL") || !strings.Contains(b.String(), "tnt_1") {
		t.Fatalf("one total: %v\n%s", err, b.String())
	}
	b.Reset()
	none := usageTotal{Model: "chat", Day: "2025-03-02", Requests: 1, PromptTokens: 5, CompletionTokens: 1}
	if err := usageTable(&b, []usageTotal{one, none}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[2]), " ") != "2025-03-02 - - chat 1 5 1 0" ||
		strings.Join(strings.Fields(lines[3]), " ") != "TOTAL 3 15 5 1" {
		t.Fatalf("two totals:\n%s", b.String())
	}
}
