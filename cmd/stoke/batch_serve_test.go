package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// batchOutputLine is a line of a batch's output or error file, decoded
// strictly enough to check OpenAI's shape.
type batchOutputLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// readBatchFile downloads a batch output or error file with the client.
func readBatchFile(t *testing.T, client oai.Client, id string) []batchOutputLine {
	t.Helper()
	resp, err := client.Files.Content(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []batchOutputLine
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		raw := sc.Bytes()
		var keys map[string]json.RawMessage
		var l batchOutputLine
		if err := json.Unmarshal(raw, &keys); err != nil || json.Unmarshal(raw, &l) != nil {
			t.Fatalf("result line %q is not JSON: %v", raw, err)
		}
		for _, k := range []string{"id", "custom_id", "response", "error"} {
			if _, ok := keys[k]; !ok {
				t.Fatalf("result line %s has no %q", raw, k)
			}
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestServeBatchWithOpenAIClient: the official client uploads a file,
// creates a batch on the real engine (a synthetic model), polls it to
// completed and downloads its output and error files, whose lines have
// OpenAI's shape; each line's temperature-0 answer equals the same request
// sent alone, and a line the engine refuses is in the error file with the
// engine's 400.
func TestServeBatchWithOpenAIClient(t *testing.T) {
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\n")
	base := startServe(t, nil, "--data", t.TempDir(), "--bucket", "file://"+bucketDir, "--watch-interval", "100ms", "--warm", "0", "--slots", "2")
	waitUntil(t, "chat has a ready replica", 60*time.Second, func() bool { return readyReplicas(t, base, "chat") == 1 })
	ctx := context.Background()
	client := oai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))

	const n = 8
	var in strings.Builder
	prompt := func(i int) string { return fmt.Sprintf("Once upon a time, story %d", i) }
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"req-%d","method":"POST","url":"/v1/completions","body":{"model":"chat","prompt":%q,"max_tokens":12,"temperature":0}}`+"\n", i, prompt(i))
	}
	in.WriteString(`{"custom_id":"bad","method":"POST","url":"/v1/completions","body":{"model":"chat","prompt":"x","temperature":5}}` + "\n")
	f, err := client.Files.New(ctx, oai.FileNewParams{File: oai.File(strings.NewReader(in.String()), "in.jsonl", "application/jsonl"), Purpose: oai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Batches.New(ctx, oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1Completions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Object != "batch" || b.Status != oai.BatchStatusValidating || b.Metadata["team"] != "a" || b.ExpiresAt-b.CreatedAt != 24*3600 {
		t.Fatalf("created %+v", b)
	}
	waitUntil(t, "the batch completes", 2*time.Minute, func() bool {
		b, err = client.Batches.Get(ctx, b.ID)
		return err == nil && (b.Status == oai.BatchStatusCompleted || b.Status == oai.BatchStatusFailed)
	})
	if b.Status != oai.BatchStatusCompleted || b.RequestCounts.Total != n+1 || b.RequestCounts.Completed != n || b.RequestCounts.Failed != 1 ||
		b.InProgressAt == 0 || b.FinalizingAt == 0 || b.CompletedAt == 0 || b.OutputFileID == "" || b.ErrorFileID == "" {
		t.Fatalf("batch ended %+v", b)
	}
	page, err := client.Batches.List(ctx, oai.BatchListParams{Limit: oai.Int(10)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID {
		t.Fatalf("list = %+v, %v", page, err)
	}
	out := readBatchFile(t, client, b.OutputFileID)
	if len(out) != n {
		t.Fatalf("output has %d lines, want %d", len(out), n)
	}
	seen := map[string]bool{}
	for _, l := range out {
		if seen[l.CustomID] || l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil || !strings.HasPrefix(l.ID, "batch_req_") {
			t.Fatalf("output line %+v", l)
		}
		seen[l.CustomID] = true
		var got oai.Completion
		if err := json.Unmarshal(l.Response.Body, &got); err != nil || len(got.Choices) != 1 {
			t.Fatalf("output body %s: %v", l.Response.Body, err)
		}
		var i int
		fmt.Sscanf(l.CustomID, "req-%d", &i)
		alone, err := client.Completions.New(ctx, oai.CompletionNewParams{Model: "chat", Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String(prompt(i))},
			MaxTokens: oai.Int(12), Temperature: oai.Float(0)})
		if err != nil {
			t.Fatal(err)
		}
		if got.Choices[0].Text != alone.Choices[0].Text || got.Choices[0].Text == "" {
			t.Errorf("%s: batch answered %q, alone %q", l.CustomID, got.Choices[0].Text, alone.Choices[0].Text)
		}
	}
	errs := readBatchFile(t, client, b.ErrorFileID)
	if len(errs) != 1 || errs[0].CustomID != "bad" || errs[0].Response == nil || errs[0].Response.StatusCode != 400 {
		t.Fatalf("error file %+v", errs)
	}
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	if json.Unmarshal(errs[0].Response.Body, &e) != nil || e.Error.Message == "" {
		t.Fatalf("error line body %s", errs[0].Response.Body)
	}

	// A bad file fails its own batch, with each error where OpenAI puts it,
	// and loses nothing of the batch that finished.
	bad := in.String()[:strings.Index(in.String(), "\n")+1] + in.String()[:strings.Index(in.String(), "\n")+1] + "{oops\n"
	f2, err := client.Files.New(ctx, oai.FileNewParams{File: oai.File(strings.NewReader(bad), "bad.jsonl", "application/jsonl"), Purpose: oai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := client.Batches.New(ctx, oai.BatchNewParams{InputFileID: f2.ID, Endpoint: oai.BatchNewParamsEndpointV1Completions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the bad batch fails", time.Minute, func() bool {
		b2, err = client.Batches.Get(ctx, b2.ID)
		return err == nil && b2.Status == oai.BatchStatusFailed
	})
	codes := map[string]int64{}
	for _, e := range b2.Errors.Data {
		codes[e.Code] = e.Line
	}
	if b2.Errors.Object != "list" || codes["duplicate_custom_id"] != 2 || codes["invalid_json_line"] != 3 || b2.FailedAt == 0 {
		t.Errorf("failed batch errors %+v", b2.Errors)
	}
	if again := readBatchFile(t, client, b.OutputFileID); len(again) != n {
		t.Errorf("the finished batch's output has %d lines after a bad batch, want %d", len(again), n)
	}
	if _, err := client.Batches.Cancel(ctx, b.ID); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("cancel of a completed batch: %v", err)
	}
	if _, err := client.Batches.Get(ctx, "batch_nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("get of an unknown batch: %v", err)
	}
	if _, err := client.Batches.New(ctx, oai.BatchNewParams{InputFileID: "file-nope", Endpoint: oai.BatchNewParamsEndpointV1Completions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("batch of an unknown file: %v", err)
	}
}
