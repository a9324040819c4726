package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// batchCLI runs the CLI in-process and returns its standard output and
// standard error apart.
func batchCLI(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// resultLines reads a batch output or error file: custom_id → status code.
func resultLines(t *testing.T, path string) (map[string]int, int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, n := map[string]int{}, 0
	for line := range strings.Lines(string(b)) {
		n++
		var r struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.CustomID == "" {
			t.Fatalf("%s: line %q: %v", path, line, err)
		}
		if _, dup := got[r.CustomID]; dup {
			t.Fatalf("%s: custom_id %s twice", path, r.CustomID)
		}
		got[r.CustomID] = r.Response.StatusCode
	}
	return got, n
}

// wantOneLineError checks a failed stoke process: non-zero exit and one
// line on standard error that starts with prefix and contains want.
func wantOneLineError(t *testing.T, code int, stderr, prefix, want string) {
	t.Helper()
	if code == 0 || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, prefix) || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, stderr %q: want non-zero and one line starting %q containing %q", code, stderr, prefix, want)
	}
}

// TestBatchCLI submits a batch with `stoke batch submit --wait` to a serve
// of sim engines and follows it with list, get, results and cancel.
func TestBatchCLI(t *testing.T) {
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\n")
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	base := startServe(t, nil, "--data", data, "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
		"--warm", "0", "--slots", "2", "--sim-profile", "llama-3.1-8b-fp8-h100")
	waitUntil(t, "chat has a ready replica", 30*time.Second, func() bool { return readyReplicas(t, base, "chat") == 1 })

	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var lines strings.Builder
	const n = 20
	for i := range n {
		fmt.Fprintf(&lines, `{"custom_id":"req-%02d","method":"POST","url":"/v1/chat/completions","body":{"model":"chat","messages":[{"role":"user","content":"hello %d"}],"max_tokens":4}}`+"\n", i, i)
		if i == n/2 {
			lines.WriteString(`{"custom_id":"req-hot","method":"POST","url":"/v1/chat/completions","body":{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":5}}` + "\n")
		}
	}
	if err := os.WriteFile(in, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	out, errs := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "err.jsonl")
	stdout, stderr, err := batchCLI(t, "batch", "submit", in, "--url", base, "--metadata", "run=cli-test",
		"--wait", "--output", out, "--errors", errs)
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, stderr)
	}
	id := strings.TrimSpace(stdout)
	if !strings.HasPrefix(id, "batch_") || strings.Contains(id, "\n") {
		t.Fatalf("submit printed %q, want one batch id", stdout)
	}
	if !strings.Contains(stderr, "batch "+id+" completed") {
		t.Fatalf("submit's standard error has no completed summary:\n%s", stderr)
	}
	okLines, nOK := resultLines(t, out)
	badLines, nBad := resultLines(t, errs)
	if nOK != n || nBad != 1 || badLines["req-hot"] != 400 {
		t.Fatalf("output %d lines, errors %d lines (%v); want %d and one 400 for req-hot", nOK, nBad, badLines, n)
	}
	for i := range n {
		cid := fmt.Sprintf("req-%02d", i)
		if okLines[cid] != 200 {
			t.Errorf("output's %s: status %d, want 200", cid, okLines[cid])
		}
		if _, ok := badLines[cid]; ok {
			t.Errorf("%s is in both files", cid)
		}
	}

	list, _, err := batchCLI(t, "batch", "list", "--url", base)
	if err != nil || !strings.Contains(list, id) || !strings.Contains(list, "completed") || !strings.Contains(list, fmt.Sprintf("%d/1/%d", n, n+1)) {
		t.Fatalf("list: %v\n%s", err, list)
	}
	var page struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if list, _, err = batchCLI(t, "batch", "list", "--url", base, "--json", "--limit", "1"); err != nil || json.Unmarshal([]byte(list), &page) != nil ||
		len(page.Data) != 1 || page.Data[0].ID != id {
		t.Fatalf("list --json: %v\n%s", err, list)
	}

	get, _, err := batchCLI(t, "batch", "get", id, "--url", base)
	if err != nil || !strings.Contains(get, "completed") || !strings.Contains(get, "run=cli-test") {
		t.Fatalf("get: %v\n%s", err, get)
	}
	var obj struct {
		Status string `json:"status"`
	}
	if get, _, err = batchCLI(t, "batch", "get", id, "--url", base, "--json"); err != nil || json.Unmarshal([]byte(get), &obj) != nil || obj.Status != "completed" {
		t.Fatalf("get --json: %v\n%s", err, get)
	}

	for _, c := range []struct {
		args []string
		file string
	}{{nil, out}, {[]string{"--errors"}, errs}} {
		got, _, err := batchCLI(t, append([]string{"batch", "results", id, "--url", base}, c.args...)...)
		want, _ := os.ReadFile(c.file)
		if err != nil || got != string(want) {
			t.Fatalf("results %v: %v\n%q\nwant %q", c.args, err, got, want)
		}
	}
	copied := filepath.Join(dir, "copy.jsonl")
	if _, _, err := batchCLI(t, "batch", "results", id, "--url", base, "-o", copied); err != nil {
		t.Fatal(err)
	}
	if a, b := fileSize(copied), fileSize(out); a != b {
		t.Fatalf("results -o wrote %d bytes, want %d", a, b)
	}

	code, msg := stokeProcess(t, nil, 30*time.Second, "batch", "cancel", id, "--url", base)
	wantOneLineError(t, code, msg, "stoke: batch "+id+": ", "cannot be cancelled")
	code, msg = stokeProcess(t, nil, 30*time.Second, "batch", "get", "batch_nope", "--url", base)
	wantOneLineError(t, code, msg, "stoke: batch batch_nope: ", "No such Batch object")

	// A batch that fails validation exits non-zero and lists its errors.
	dup := filepath.Join(dir, "dup.jsonl")
	line := `{"custom_id":"same","method":"POST","url":"/v1/completions","body":{"model":"chat","prompt":"hi","max_tokens":2}}` + "\n"
	if err := os.WriteFile(dup, []byte(line+line), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, err = batchCLI(t, "batch", "submit", dup, "--url", base, "--wait")
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "failed") ||
		!strings.Contains(stderr, "line 2: ") || !strings.Contains(stderr, "(duplicate_custom_id)") {
		t.Fatalf("submit of duplicates: %v\n%s", err, stderr)
	}
}

// TestBatchCLIErrors: mistakes the CLI catches itself, and an unreachable
// server, each as one line.
func TestBatchCLIErrors(t *testing.T) {
	dir := t.TempDir()
	noURL := filepath.Join(dir, "nourl.jsonl")
	if err := os.WriteFile(noURL, []byte(`{"custom_id":"a","method":"POST","body":{}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unreachable := "http://" + freeAddr(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"output without wait", []string{"batch", "submit", noURL, "--output", filepath.Join(dir, "o")}, "need --wait"},
		{"bad metadata", []string{"batch", "submit", noURL, "--metadata", "novalue"}, `--metadata "novalue"`},
		{"no url to infer", []string{"batch", "submit", noURL}, `no "url"`},
		{"missing file", []string{"batch", "submit", filepath.Join(dir, "nope.jsonl")}, "nope.jsonl"},
		{"unreachable", []string{"batch", "get", "batch_x", "--url", unreachable}, "batch batch_x: cannot reach stoke serve at " + unreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := batchCLI(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q, want one line containing %q", err, tc.want)
			}
		})
	}
}
