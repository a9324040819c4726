package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// adminPost sends an admin request with the admin key and decodes the
// answer into out; it returns the status.
func adminPost(t *testing.T, base, adminKey, path, body string, out any) int {
	t.Helper()
	return adminPostB(t, base, adminKey, path, body, out)
}

// readyWithAdminKey reports whether model has a ready runtime, asking
// /admin/runtimes with the admin key.
func readyWithAdminKey(base, adminKey, model string) bool {
	req, _ := http.NewRequest(http.MethodGet, base+"/admin/runtimes", nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var rts struct{ Data []runtimeJSON }
	json.NewDecoder(resp.Body).Decode(&rts)
	for _, r := range rts.Data {
		if r.Model == model && r.State == "ready" {
			return true
		}
	}
	return false
}

// adminPostB is adminPost for tests and benchmarks.
func adminPostB(t testing.TB, base, adminKey, path, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if adminKey != "" {
		req.Header.Set("Authorization", "Bearer "+adminKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// TestServeKeys: with an admin key, /v1 takes tenant keys: openai-go with
// a key is served, a bad key gets 401 invalid_api_key, a model outside the
// key's scope is a 404 model_not_found (and not listed), the admin
// endpoints take only the admin key, a revoked key is refused at once, and
// no key is ever written to serve's log.
func TestServeKeys(t *testing.T) {
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\n")
	pushTo(t, bucketDir, "other", "replicas:\n  min: 0\n  max: 1\n")
	const adminKey = "admin-test-key-0123456789"
	keyFile := filepath.Join(t.TempDir(), "admin.key")
	os.WriteFile(keyFile, []byte(adminKey+"\n"), 0o600)
	s := launchServe(t, nil, freeAddr(t), "--data", t.TempDir(), "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
		"--warm", "0", "--slots", "2", "--sim-profile", "llama-3.1-8b-fp8-h100", "--admin-key-file", keyFile)
	s.waitHealthy(t)
	base := s.base
	ctx := context.Background()

	var tenant struct{ ID string }
	if code := adminPost(t, base, adminKey, "/admin/tenants", `{"name":"acme"}`, &tenant); code != 200 || tenant.ID == "" {
		t.Fatalf("create tenant: %d %+v", code, tenant)
	}
	var created struct {
		ID, Key, Hint string
	}
	if code := adminPost(t, base, adminKey, "/admin/keys", `{"tenant":"acme","models":["chat"]}`, &created); code != 200 || !strings.HasPrefix(created.Key, "sk-stoke-") {
		t.Fatalf("create key: %d %+v", code, created)
	}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if code := adminPost(t, base, created.Key, "/admin/tenants", `{"name":"evil"}`, &e); code != 401 || e.Error.Code != "invalid_api_key" {
		t.Errorf("a tenant key on /admin: %d %+v", code, e)
	}
	if code := adminPost(t, base, "", "/admin/tenants", `{"name":"evil"}`, nil); code != 401 {
		t.Errorf("no key on /admin: %d", code)
	}

	client := oai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(created.Key), option.WithMaxRetries(0))
	waitUntil(t, "chat has a ready replica", 60*time.Second, func() bool { return readyWithAdminKey(base, adminKey, "chat") })
	resp, err := client.Completions.New(ctx, oai.CompletionNewParams{Model: "chat", Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("hi")}, MaxTokens: oai.Int(2)})
	if err != nil || len(resp.Choices) != 1 {
		t.Fatalf("completion with a key: %v", err)
	}
	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "chat" {
		t.Fatalf("models the scoped key sees: %+v, %v", models, err)
	}
	var apiErr *oai.Error
	_, err = client.Completions.New(ctx, oai.CompletionNewParams{Model: "other", Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("hi")}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("a model outside the key's scope: %v", err)
	}
	if _, err := client.Models.Get(ctx, "other"); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("GET /v1/models/other with a key scoped to chat: %v", err)
	}
	bad := oai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-stoke-not-a-real-key-000000000000000000000"), option.WithMaxRetries(0))
	if _, err := bad.Models.List(ctx); !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Errorf("a bad key: %v", err)
	}
	if code := adminPost(t, base, adminKey, "/admin/keys/"+created.ID+"/revoke", ``, nil); code != 200 {
		t.Fatalf("revoke: %d", code)
	}
	if _, err := client.Models.List(ctx); !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
		t.Errorf("a revoked key: %v", err)
	}
	log := s.log()
	for _, secret := range []string{created.Key, adminKey} {
		if strings.Contains(log, secret) {
			t.Fatalf("serve's log holds a key")
		}
	}
}

// TestServeRefusesAnOpenPublicAddress: on a non-loopback address with no
// key to check requests against, serve does not start unless --auth=none.
func TestServeRefusesAnOpenPublicAddress(t *testing.T) {
	out, err := stoke(t, "serve", "--data", t.TempDir(), "--listen", "0.0.0.0:0", "--sim-profile", "llama-3.1-8b-fp8-h100")
	if err == nil || !strings.Contains(err.Error(), "--auth=none") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("serve on 0.0.0.0 with no keys: %v\n%s", err, out)
	}
}

// TestServeLimitsNeverOvershoot: 200 concurrent requests of a tenant with
// a tokens-per-minute limit, and separately of one with a money budget,
// through serve (sim engines, the deployment priced in its stoke.yaml):
// the tokens (dollars) the answers report never add up past the limit
// (budget), and every refused request got its 429: rate_limit_exceeded
// with Retry-After and x-ratelimit headers, insufficient_quota.
func TestServeLimitsNeverOvershoot(t *testing.T) {
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\nprice:\n  input_per_1m: 1000\n  output_per_1m: 4000\n")
	const adminKey = "admin-test-key-limits-0123456789"
	base := startServe(t, []string{"STOKE_ADMIN_KEY=" + adminKey}, "--data", t.TempDir(), "--bucket", "file://"+bucketDir,
		"--watch-interval", "100ms", "--warm", "0", "--slots", "1", "--sim-profile", "llama-3.1-8b-fp8-h100")
	for _, tc := range []struct {
		name, limits, code string
		limit              float64
		spent              func(prompt, completion int) float64
	}{
		{"tokens per minute", `{"tokens_per_minute":3000}`, "rate_limit_exceeded", 3000, func(p, c int) float64 { return float64(p + c) }},
		{"money budget", `{"budget_usd":2}`, "insufficient_quota", 2, func(p, c int) float64 { return float64(p)*1000/1e6 + float64(c)*4000/1e6 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tenant := strings.ReplaceAll(tc.name, " ", "-")
			if code := adminPost(t, base, adminKey, "/admin/tenants", `{"name":"`+tenant+`","limits":`+tc.limits+`}`, nil); code != 200 {
				t.Fatalf("create tenant: %d", code)
			}
			var key struct{ Key string }
			adminPost(t, base, adminKey, "/admin/keys", `{"tenant":"`+tenant+`"}`, &key)
			waitUntil(t, "chat answers", 60*time.Second, func() bool {
				req, _ := http.NewRequest(http.MethodGet, base+"/v1/models/chat", nil)
				req.Header.Set("Authorization", "Bearer "+key.Key)
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				return err == nil && resp.StatusCode == 200
			})
			var (
				mu              sync.Mutex
				served, refused int
				spent           float64
				problems        int
			)
			var wg sync.WaitGroup
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := fmt.Sprintf(`{"model":"chat","prompt":"request %d","max_tokens":16}`, i)
					req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+key.Key)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					defer resp.Body.Close()
					var out struct {
						Usage struct {
							PromptTokens     int `json:"prompt_tokens"`
							CompletionTokens int `json:"completion_tokens"`
						} `json:"usage"`
						Error struct{ Code string } `json:"error"`
					}
					json.NewDecoder(resp.Body).Decode(&out)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case resp.StatusCode == 200:
						served++
						spent += tc.spent(out.Usage.PromptTokens, out.Usage.CompletionTokens)
					case resp.StatusCode == 429 && out.Error.Code == tc.code &&
						(tc.code != "rate_limit_exceeded" || resp.Header.Get("Retry-After") != "" && resp.Header.Get("x-ratelimit-limit-tokens") == "3000"):
						refused++
					default:
						problems++
					}
				}()
			}
			wg.Wait()
			t.Logf("%d served (%.4g of %.4g), %d refused", served, spent, tc.limit, refused)
			if problems > 0 || served+refused != 200 {
				t.Fatalf("%d answers were neither served nor the right 429", problems)
			}
			if spent > tc.limit || served == 0 || refused == 0 {
				t.Fatalf("%.4g spent against a limit of %.4g (%d served, %d refused)", spent, tc.limit, served, refused)
			}
		})
	}
}
