package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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
