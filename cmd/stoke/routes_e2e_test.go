package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// routedCompletion sends a completion for model with prompt to base and
// returns its status, the deployment that served it and its body.
func routedCompletion(t *testing.T, base, model, prompt string) (int, string, string) {
	t.Helper()
	client := &http.Client{Timeout: time.Minute}
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, model, prompt)
	resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a 503 without Retry-After: %s", b)
	}
	return resp.StatusCode, resp.Header.Get("X-Stoke-Deployment"), string(b)
}

// killEngineOf SIGKILLs the engine process of model's ready runtime under
// data (its record in DATA/rt/ID.json names its pid).
func killEngineOf(t *testing.T, base, data, model string) {
	t.Helper()
	for _, r := range listRuntimes(t, base) {
		if r.Model != model || r.State != "ready" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(data, "rt", r.ID+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			PID int `json:"pid"`
		}
		if err := json.Unmarshal(b, &rec); err != nil || rec.PID <= 0 {
			t.Fatalf("runtime record %s: %v", b, err)
		}
		if err := syscall.Kill(-rec.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s has no ready runtime to kill", model)
}

// TestServeRoutes runs serve with a routes file against sim engines and an
// external provider that is a second serve, reached with its own key:
// the auto rule sends short prompts to the small deployment and long ones
// to the large; with the large one's replica killed, its requests are
// served by the small one; a route whose deployment gets no room falls
// back to the provider (under the provider's model name and key); with
// the provider killed too, a 503 with Retry-After, at once.
func TestServeRoutes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two serves and their engines")
	}
	// The provider: a second serve with keys.
	extBucket, extData := t.TempDir(), t.TempDir()
	pushTo(t, extBucket, "ext-model", "replicas:\n  min: 1\n  max: 1\n")
	killEnginesAtEnd(t, extData)
	adminKeyFile := filepath.Join(t.TempDir(), "admin.key")
	os.WriteFile(adminKeyFile, []byte("sk-admin-provider-test\n"), 0o600)
	ext := launchServe(t, nil, freeAddr(t), "--data", extData, "--bucket", "file://"+extBucket, "--watch-interval", "100ms", "--warm", "0",
		"--slots", "1", "--sim-profile", "llama-3.1-8b-fp8-h100", "--admin-key-file", adminKeyFile)
	ext.waitHealthy(t)
	waitUntil(t, "the provider is ready", 60*time.Second, func() bool { return readyWithAdminKey(ext.base, "sk-admin-provider-test", "ext-model") })
	if code := adminPost(t, ext.base, "sk-admin-provider-test", "/admin/tenants", `{"name":"stoke-gateway"}`, nil); code != 200 {
		t.Fatalf("create the provider's tenant: %d", code)
	}
	var key struct{ Key string }
	adminPost(t, ext.base, "sk-admin-provider-test", "/admin/keys", `{"tenant":"stoke-gateway"}`, &key)

	// The gateway: small and large take both slots, so "cold" never gets one.
	bucket, data := t.TempDir(), t.TempDir()
	for _, name := range []string{"small", "large"} {
		pushTo(t, bucket, name, "replicas:\n  min: 1\n  max: 1\n")
	}
	pushTo(t, bucket, "cold", "replicas:\n  min: 0\n  max: 1\n")
	killEnginesAtEnd(t, data)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	os.WriteFile(routes, []byte(`routes:
  - name: chat
    rules:
      - match: {max_prompt_tokens: 8}
        to: small
    split: [{to: large, weight: 1}]
    fallbacks: [small, ext]
    fallback_after: 100ms # well under the ~300 ms a killed replica's replacement takes to start
  - name: far
    split: [{to: cold, weight: 1}]
    fallbacks: [ext]
    fallback_after: 300ms
providers:
  - name: ext
    base_url: `+ext.base+`/v1
    model: ext-model
    api_key_env: EXT_PROVIDER_KEY
    timeout: 10s
`), 0o644)
	s := launchServe(t, []string{"EXT_PROVIDER_KEY=" + key.Key}, freeAddr(t), "--data", data, "--bucket", "file://"+bucket,
		"--watch-interval", "100ms", "--warm", "0", "--slots", "2", "--sim-profile", "llama-3.1-8b-fp8-h100", "--routes", routes)
	s.waitHealthy(t)
	waitUntil(t, "small and large are ready", 60*time.Second, func() bool {
		return readyReplicas(t, s.base, "small") == 1 && readyReplicas(t, s.base, "large") == 1
	})
	var models struct{ Data []struct{ ID string } }
	getJSON(t, s.base+"/v1/models", &models)
	if !strings.Contains(fmt.Sprint(models.Data), "{chat}") {
		t.Fatalf("/v1/models does not list the route: %v", models.Data)
	}

	// A route set through the CLI takes effect at once; the file's are read-only.
	apiRoute := filepath.Join(t.TempDir(), "tiny.yaml")
	os.WriteFile(apiRoute, []byte("split:\n  - {to: small, weight: 1}\n"), 0o644)
	if out, err := stoke(t, "route", "set", "tiny", "--file", apiRoute, "--url", s.base); err != nil {
		t.Fatalf("route set: %v\n%s", err, out)
	}
	if code, dep, body := routedCompletion(t, s.base, "tiny", "hello"); code != 200 || dep != "small" {
		t.Fatalf("the CLI's route: %d from %q (%s)", code, dep, body)
	}
	if out, err := stoke(t, "route", "set", "chat", "--file", apiRoute, "--url", s.base); err == nil || !strings.Contains(err.Error(), "routes file") {
		t.Fatalf("changing a file's route through the CLI: %v\n%s", err, out)
	}
	if out, err := stoke(t, "route", "list", "--url", s.base); err != nil || !strings.Contains(string(out), "tiny") || !strings.Contains(string(out), "chat") {
		t.Fatalf("route list: %v\n%s", err, out)
	}

	short, long := "hi", strings.Repeat("once upon a time ", 8)
	for prompt, want := range map[string]string{short: "small", long: "large"} {
		if code, dep, body := routedCompletion(t, s.base, "chat", prompt); code != 200 || dep != want {
			t.Fatalf("prompt of %d bytes: %d from %q (%s), want 200 from %s", len(prompt), code, dep, body, want)
		}
	}

	killEngineOf(t, s.base, data, "large")
	killed := time.Now()
	code, dep, body := routedCompletion(t, s.base, "chat", long)
	if code != 200 || dep != "small" {
		t.Fatalf("large killed: %d from %q (%s), want 200 from small", code, dep, body)
	}
	t.Logf("from the large replica's death to its route's first answer from the fallback: %v", time.Since(killed).Round(time.Millisecond))

	code, dep, body = routedCompletion(t, s.base, "far", "hello")
	if code != 200 || dep != "ext" || !strings.Contains(body, `"model":"ext-model"`) {
		t.Fatalf("no room for cold: %d from %q (%s), want 200 from the provider as ext-model", code, dep, body)
	}

	syscall.Kill(ext.cmd.Process.Pid, syscall.SIGKILL)
	<-ext.done
	start := time.Now()
	if code, _, body := routedCompletion(t, s.base, "far", "hello"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"error"`) {
		t.Fatalf("everything down: %d %s, want a 503", code, body)
	}
	t.Logf("everything down: the 503 came after %v", time.Since(start).Round(time.Millisecond))
}
