package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/synth"
)

// storiesCopy copies the real tiny checkpoint (stories260K) to a new
// directory; with seed > 0 its weights are replaced by random ones of the
// same config (a bad revision of the same model). Extra files are added.
func storiesCopy(t *testing.T, seed uint64, files map[string]string) string {
	t.Helper()
	src := testmodel.Dir(t)
	dst := filepath.Join(t.TempDir(), "src")
	if seed > 0 {
		raw, err := os.ReadFile(filepath.Join(src, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := model.ParseConfig(raw)
		if err != nil {
			t.Fatal(err)
		}
		if err := synth.Write(context.Background(), dst, synth.Options{Config: &cfg, DType: dtype.F32, Seed: seed}); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		keep := strings.HasPrefix(e.Name(), "tokenizer") || (seed == 0 && (e.Name() == "config.json" || strings.HasSuffix(e.Name(), ".safetensors")))
		if !keep {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(b)
	}
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(dst, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// pushStories pushes storiesCopy(seed, files) to bucketDir/name.
func pushStories(t *testing.T, bucketDir, name string, seed uint64, files map[string]string) {
	t.Helper()
	if out, err := stoke(t, "push", storiesCopy(t, seed, files), "file://"+bucketDir+"/"+name); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// deploymentView is the part of GET /admin/deployments/NAME the rollout
// test reads.
type deploymentView struct {
	Revision string `json:"revision"`
	Pinned   bool   `json:"pinned"`
	Rollout  *struct {
		ID        int64           `json:"id"`
		Stable    string          `json:"stable"`
		Candidate string          `json:"candidate"`
		State     string          `json:"state"`
		Reason    string          `json:"reason"`
		Eval      json.RawMessage `json:"eval"`
	} `json:"rollout"`
}

// greedyCompletion is model's temperature-0 answer to prompt at base, and
// the revision that gave it.
func greedyCompletion(t *testing.T, base, model, prompt string, maxTokens int) (text, revision string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d,"temperature":0}`, model, prompt, maxTokens)
	resp, err := (&http.Client{Timeout: time.Minute}).Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d %s", resp.StatusCode, b)
	}
	var c struct{ Choices []struct{ Text string } }
	if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("completion %s: %v", b, err)
	}
	return c.Choices[0].Text, resp.Header.Get("X-Stoke-Revision")
}

// TestServeCanaryEvalGate pushes revisions of one deployment through a
// gated rollout on the real engine: the stable revision is the real tiny
// checkpoint (stories260K), and the eval set's references are its own
// greedy answers. A bad revision (the same config, random weights) serves its canary share, fails
// the exact-match gate and ends rejected, with every request back on the
// stable revision; a good one (the same weights) passes a log-likelihood
// gate (prompt log-probabilities through echo) and is promoted, its
// replicas taking over. By hand: pinning an older revision serves it and
// keeps a new push from deploying; rollback ends a canary.
func TestServeCanaryEvalGate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts serve and real engines")
	}
	bucket, data := t.TempDir(), t.TempDir()
	killEnginesAtEnd(t, data)
	pushStories(t, bucket, "chat", 0, map[string]string{"stoke.yaml": "replicas:\n  min: 1\n  max: 1\n"})
	s := launchServe(t, nil, freeAddr(t), "--data", data, "--bucket", "file://"+bucket, "--watch-interval", "100ms", "--warm", "0",
		"--slots", "3")
	s.waitHealthy(t)
	waitUntil(t, "chat is ready", 90*time.Second, func() bool { return readyReplicas(t, s.base, "chat") == 1 })
	var dep deploymentView
	getJSON(t, s.base+"/admin/deployments/chat", &dep)
	stable := dep.Revision

	// The eval set: the stable revision's own greedy answers.
	var eval strings.Builder
	for _, p := range []string{"Once upon a time", "The cat", "She said", "In the park", "A little dog"} {
		ref, rev := greedyCompletion(t, s.base, "chat", p, 6)
		if rev != stable {
			t.Fatalf("served by revision %q, want %s", rev, stable)
		}
		fmt.Fprintf(&eval, "{\"prompt\":%q,\"reference\":%q,\"max_tokens\":6}\n", p, ref)
	}
	gated := func(metric string) string {
		return "replicas:\n  min: 1\n  max: 1\nrollout:\n  canary_percent: 50\n  eval:\n    file: eval.jsonl\n    metric: " + metric +
			"\n    max_regression: 0.01\n    timeout: 2m\n"
	}
	waitRollout := func(what string, id int64, state string) deploymentView {
		t.Helper()
		var d deploymentView
		waitUntil(t, what, 3*time.Minute, func() bool {
			getJSON(t, s.base+"/admin/deployments/chat", &d)
			return d.Rollout != nil && d.Rollout.ID > id && d.Rollout.State == state
		})
		return d
	}

	// A bad revision: other weights.
	pushStories(t, bucket, "chat", 2, map[string]string{"stoke.yaml": gated("exact_match"), "eval.jsonl": eval.String()})
	dep = waitRollout("the bad revision is rejected", 0, "rejected")
	canaryID, bad := dep.Rollout.ID, dep.Rollout.Candidate
	t.Logf("bad revision: %s", dep.Rollout.Eval)
	if dep.Revision != stable || bad == stable || !strings.Contains(dep.Rollout.Reason, "exact_match") {
		t.Fatalf("after the bad push: %+v; want the stable revision served and the figures in the reason", dep)
	}
	var verdict struct {
		Promote           bool
		Stable, Candidate struct{ Value float64 }
	}
	if err := json.Unmarshal(dep.Rollout.Eval, &verdict); err != nil || verdict.Promote || verdict.Stable.Value != 1 || verdict.Candidate.Value >= 1 {
		t.Fatalf("verdict %s (%v): want the stable revision matching all of its own answers and the candidate fewer", dep.Rollout.Eval, err)
	}
	for range 10 {
		if _, rev := greedyCompletion(t, s.base, "chat", "Once", 2); rev != stable {
			t.Fatalf("after the rejection a request was served by %s, want %s", rev, stable)
		}
	}
	if code, _, _ := routedCompletion(t, s.base, "chat@"+bad, "Once"); code != http.StatusNotFound {
		t.Fatalf("the rejected revision, pinned: %d, want 404", code)
	}

	// A good revision: the stable weights, gated by log-likelihood.
	pushStories(t, bucket, "chat", 0, map[string]string{"stoke.yaml": gated("log_likelihood"), "eval.jsonl": eval.String()})
	dep = waitRollout("the good revision is promoted", canaryID, "promoted")
	good := dep.Rollout.Candidate
	t.Logf("good revision: %s", dep.Rollout.Eval)
	if dep.Revision != good || good == stable || good == bad {
		t.Fatalf("after the good push: %+v; want the candidate served", dep)
	}
	if err := json.Unmarshal(dep.Rollout.Eval, &verdict); err != nil || !verdict.Promote || verdict.Stable.Value != verdict.Candidate.Value ||
		verdict.Stable.Value >= 0 {
		t.Fatalf("verdict %s (%v): want equal negative log-likelihoods on equal weights", dep.Rollout.Eval, err)
	}
	waitUntil(t, "the stable replica is replaced", time.Minute, func() bool { return readyReplicas(t, s.base, "chat") == 1 })
	for range 5 {
		if _, rev := greedyCompletion(t, s.base, "chat", "Once", 2); rev != good {
			t.Fatalf("after the promotion a request was served by %s, want %s", rev, good)
		}
	}

	// By hand: pin the first revision; a push while pinned is not deployed.
	var pinned deploymentView
	out, err := stoke(t, "deployment", "pin", "chat", stable, "--url", s.base)
	if err != nil || json.Unmarshal([]byte(out), &pinned) != nil || !pinned.Pinned || pinned.Revision != stable {
		t.Fatalf("deployment pin: %v %s", err, out)
	}
	waitUntil(t, "the pinned revision serves", time.Minute, func() bool {
		_, rev := greedyCompletion(t, s.base, "chat", "Once", 2)
		return rev == stable
	})
	if code := adminPost(t, s.base, "", "/admin/deployments/chat/pin", `{"revision":"sha256:nope"}`, nil); code != http.StatusBadRequest {
		t.Fatalf("pinning an unknown revision: %d, want 400", code)
	}
	if code := adminPost(t, s.base, "", "/admin/deployments/chat/promote", ``, nil); code != http.StatusConflict {
		t.Fatalf("promote with no canary: %d, want 409", code)
	}
	pushStories(t, bucket, "chat", 3, map[string]string{"stoke.yaml": gated("exact_match"), "eval.jsonl": eval.String()})
	waitUntil(t, "the push is recorded, not deployed", time.Minute, func() bool {
		b, _ := os.ReadFile(s.logPath)
		return strings.Contains(string(b), "deployment is pinned")
	})
	getJSON(t, s.base+"/admin/deployments/chat", &dep)
	if dep.Revision != stable || dep.Rollout.Candidate != good {
		t.Fatalf("a push to a pinned deployment moved it: %+v", dep)
	}

	// Unpinned, a canary with no eval gate waits for a hand: rolled back.
	if code := adminPost(t, s.base, "", "/admin/deployments/chat/unpin", ``, &pinned); code != 200 || pinned.Pinned {
		t.Fatalf("unpin: %d %+v", code, pinned)
	}
	pushStories(t, bucket, "chat", 4, map[string]string{"stoke.yaml": "replicas:\n  min: 1\n  max: 1\nrollout:\n  canary_percent: 50\n"})
	dep = waitRollout("the manual canary starts", canaryID+1, "canary")
	var ended struct{ State, Reason string }
	if out, err := stoke(t, "deployment", "rollback", "chat", "--url", s.base); err != nil || json.Unmarshal([]byte(out), &ended) != nil ||
		ended.State != "rolled_back" {
		t.Fatalf("deployment rollback: %v %s", err, out)
	}
	if out, err := stoke(t, "deployment", "rollback", "chat", "--url", s.base); err == nil || !strings.Contains(err.Error(), "no canary") {
		t.Fatalf("a second rollback: %v %s; want an error saying there is no canary", err, out)
	}
	if out, err := stoke(t, "deployment", "list", "--url", s.base); err != nil || !strings.Contains(out, "rolled_back") ||
		!strings.Contains(out, shortDigest(stable)) {
		t.Fatalf("deployment list: %v\n%s", err, out)
	}
	getJSON(t, s.base+"/admin/deployments/chat", &dep)
	if dep.Revision != stable || dep.Rollout.State != "rolled_back" {
		t.Fatalf("after the rollback: %+v; want the pinned revision still served", dep)
	}
}
