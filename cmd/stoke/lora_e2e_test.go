package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/synth"
)

// TestServeLoRA pushes a base model and a LoRA adapter under it, and the
// adapter merged into the base's weights as a model of its own: stoke
// serve lists BASE:ADAPTER, serves it on the base's replicas (the real
// engine, the adapter fetched from the bucket at the revision the watcher
// validated), with exactly the tokens the merged model gives, which are
// not the base's.
func TestServeLoRA(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end: several engines")
	}
	ctx := context.Background()
	root := t.TempDir()
	src, adapter, merged := filepath.Join(root, "src"), filepath.Join(root, "adapter"), filepath.Join(root, "merged")
	if err := synth.Write(ctx, src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	ck, err := checkpoint.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ck.Config()
	ck.Close()
	if err := synth.WriteAdapter(adapter, cfg, synth.AdapterOptions{Rank: 8, Seed: 9, Delta: 0.05}); err != nil {
		t.Fatal(err)
	}
	if err := synth.MergeAdapter(ctx, src, adapter, merged); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{src, merged} {
		if err := os.WriteFile(filepath.Join(dir, "stoke.yaml"), []byte("replicas:\n  min: 0\n  max: 1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bucketDir := filepath.Join(root, "bucket")
	if err := os.MkdirAll(bucketDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{src, "tiny"}, {merged, "merged"}, {adapter, "tiny/adapters/sql"}} {
		if out, err := stoke(t, "push", p[0], "file://"+filepath.Join(bucketDir, p[1])); err != nil {
			t.Fatalf("push %s: %v\n%s", p[1], err, out)
		}
	}
	// A pushed adapter that does not fit its base is refused there.
	other := cfg
	other.HiddenSize *= 2
	misfit := filepath.Join(root, "misfit")
	if err := synth.WriteAdapter(misfit, other, synth.AdapterOptions{Rank: 4, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if out, err := stoke(t, "push", misfit, "file://"+filepath.Join(bucketDir, "tiny/adapters/misfit")); err == nil || !strings.Contains(out+err.Error(), "does not fit") {
		t.Fatalf("pushing a misfit adapter: %v\n%s", err, out)
	}

	base := startServe(t, nil, "--data", filepath.Join(root, "data"), "--bucket", "file://"+bucketDir, "--watch-interval", "200ms",
		"--warm", "1", "--slots", "2", "--kv-cache-memory", "16MiB", "--threads", "1", "--max-loras", "2")
	waitUntil(t, "the adapter is listed in /v1/models", 30*time.Second, func() bool {
		var models struct {
			Data []struct {
				ID     string `json:"id"`
				Parent string `json:"parent"`
			} `json:"data"`
		}
		getJSON(t, base+"/v1/models", &models)
		for _, m := range models.Data {
			if m.ID == "tiny:sql" && m.Parent == "tiny" {
				return true
			}
		}
		return false
	})

	complete := func(model string) (int, string) {
		t.Helper()
		body := `{"model":"` + model + `","prompt":"Once upon a time","max_tokens":12,"temperature":0,"ignore_eos":true}`
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		json.Unmarshal(raw, &out)
		if resp.StatusCode != http.StatusOK || len(out.Choices) != 1 || out.Usage.CompletionTokens != 12 {
			return resp.StatusCode, string(raw)
		}
		return resp.StatusCode, out.Choices[0].Text
	}
	status, withAdapter := complete("tiny:sql")
	if status != http.StatusOK {
		t.Fatalf("tiny:sql: %d %s", status, withAdapter)
	}
	_, again := complete("tiny:sql")
	_, baseText := complete("tiny")
	_, mergedText := complete("merged")
	switch {
	case again != withAdapter:
		t.Fatalf("tiny:sql answered %q, then %q", withAdapter, again)
	case withAdapter != mergedText:
		t.Fatalf("tiny:sql gave %q, the merged model %q", withAdapter, mergedText)
	case withAdapter == baseText:
		t.Fatalf("the adapter changed nothing: %q", withAdapter)
	}
	t.Logf("tiny:sql %q, merged %q, tiny %q", withAdapter, mergedText, baseText)
	if status, body := complete("tiny:nope"); status != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Fatalf("unknown adapter: %d %s", status, body)
	}
}
