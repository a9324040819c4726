package batch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/batch/files"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
)

const simProfile = "llama-3.1-8b-fp8-h100"

// resolver serves one model, "m".
type resolver struct{ spec config.Spec }

func (r resolver) Lookup(name string) (string, config.Spec, bool) {
	return "sha256:x", r.spec, name == "m"
}
func (resolver) Poke(string)            {}
func (resolver) Known(name string) bool { return name == "m" }

// rig is a batch service on a real activator in front of real sim engines
// (in-process engine servers over HTTP), with a state store and a files
// store on disk.
type rig struct {
	st    *store.Store
	fs    *files.Store
	act   *activator.Activator
	front *httptest.Server // the activator, for interactive requests
}

// newRig starts replicas sim engines of capacity requests each behind an
// activator.
func newRig(t *testing.T, replicas, capacity int) *rig {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := bucket.Open(ctx, "file://"+filepath.Join(dir, "files"), bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := files.New(files.Options{Blobs: blobs, Meta: st})
	if err != nil {
		t.Fatal(err)
	}
	spec := config.Default()
	spec.Buffer.Timeout = config.Duration(5 * time.Second)
	act := activator.New(activator.Options{Resolver: resolver{spec}})
	for i := range replicas {
		srv, err := server.New(server.Options{Loader: server.SimLoader(server.EngineOptions{Sched: sched.Config{MaxNumSeqs: 64, MaxNumBatchedTokens: 8192}}, ""),
			Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Load(ctx, engineapi.LoadRequest{Path: simProfile, ServedModelName: "m"}); err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv.Handler())
		t.Cleanup(func() { ts.Close(); srv.Shutdown(context.Background()) })
		act.AddReplica("m", fmt.Sprintf("r%d", i), strings.TrimPrefix(ts.URL, "http://"), capacity)
	}
	front := httptest.NewServer(act)
	t.Cleanup(front.Close)
	return &rig{st: st, fs: fs, act: act, front: front}
}

// service returns a batch service on the rig, running until the test ends
// or stop is called; stop returns once it has stopped.
func (r *rig) service(t *testing.T, windows ...string) (s *Service, stop func()) {
	t.Helper()
	s, err := New(Options{Store: r.st, Files: r.fs, Dispatcher: r.act, Models: resolver{}, Windows: windows,
		Priority: activator.PriorityBatch, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return s, stop
}

// input is n chat lines with custom ids c-0…c-(n-1).
func input(n, maxTokens int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"c-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"line %d"}]}}`+"\n", i, maxTokens, i)
	}
	return b.String()
}

// owner owns the rig's files and batches (upload, create, results): a
// tenant, so that the runner's use of the batch's owner is exercised.
const owner = "tenant-t"

func (r *rig) upload(t *testing.T, content string) string {
	t.Helper()
	return r.uploadAs(t, owner, content)
}

// uploadAs uploads content as a file of own.
func (r *rig) uploadAs(t *testing.T, own, content string) string {
	t.Helper()
	f, err := r.fs.Create(context.Background(), own, "in.jsonl", files.PurposeBatch, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	return f.ID
}

func create(t *testing.T, s *Service, fileID string, window string) Batch {
	t.Helper()
	return createAs(t, s, owner, fileID, window)
}

// createAs creates a batch of own from fileID.
func createAs(t *testing.T, s *Service, own, fileID string, window string) Batch {
	t.Helper()
	b, err := s.Create(context.Background(), own, CreateRequest{InputFileID: fileID, Endpoint: "/v1/chat/completions", CompletionWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitFinal polls the batch until its status is final.
func waitFinal(t *testing.T, st *store.Store, id string, limit time.Duration) Batch {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b, err := st.Batch(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if b.Status.Final() {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s after %v (%d/%d/%d)", id, b.Status, limit, b.Completed, b.Failed, b.Total)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// results reads a batch's output or error file into result lines by
// custom_id, failing on a custom_id seen twice (seen spans both files).
func (r *rig) results(t *testing.T, fileID string, seen map[string]int) map[string]ResultLine {
	t.Helper()
	out := map[string]ResultLine{}
	if fileID == "" {
		return out
	}
	_, rc, err := r.fs.Open(context.Background(), owner, fileID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l ResultLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("result line %q: %v", sc.Text(), err)
		}
		if seen[l.CustomID]++; seen[l.CustomID] > 1 {
			t.Fatalf("custom_id %s appears twice", l.CustomID)
		}
		if !strings.HasPrefix(l.ID, "batch_req_") {
			t.Fatalf("result id %q", l.ID)
		}
		out[l.CustomID] = l
	}
	return out
}

// checkExactlyOnce asserts every custom_id c-0…c-(n-1) appears exactly
// once across the batch's files and the counts add up.
func (r *rig) checkExactlyOnce(t *testing.T, b Batch, n int) (ok, failed map[string]ResultLine) {
	t.Helper()
	seen := map[string]int{}
	ok = r.results(t, b.OutputFileID, seen)
	failed = r.results(t, b.ErrorFileID, seen)
	for i := range n {
		if seen[fmt.Sprintf("c-%d", i)] != 1 {
			t.Fatalf("custom_id c-%d appears %d times", i, seen[fmt.Sprintf("c-%d", i)])
		}
	}
	if len(seen) != n || b.Total != n || b.Completed != len(ok) || b.Failed != len(failed) {
		t.Fatalf("%d ids seen, counts %d total / %d completed / %d failed, files %d + %d", len(seen), b.Total, b.Completed, b.Failed, len(ok), len(failed))
	}
	return ok, failed
}

func TestBatchCompletes(t *testing.T) {
	r := newRig(t, 2, 8)
	s, _ := r.service(t)
	const n = 60
	b := create(t, s, r.upload(t, input(n, 4)), DefaultWindow)
	if b.Status != store.BatchValidating || !b.ExpiresAt.Equal(b.CreatedAt.Add(24*time.Hour)) {
		t.Fatalf("created %+v", b)
	}
	b = waitFinal(t, r.st, b.ID, time.Minute)
	if b.Status != store.BatchCompleted || b.ErrorFileID != "" {
		t.Fatalf("batch ended %s (error file %q)", b.Status, b.ErrorFileID)
	}
	for _, st := range []store.BatchStatus{store.BatchInProgress, store.BatchFinalizing, store.BatchCompleted} {
		if b.At[st].IsZero() {
			t.Errorf("no %s_at", st)
		}
	}
	ok, _ := r.checkExactlyOnce(t, b, n)
	for id, l := range ok {
		var body struct {
			Object  string `json:"object"`
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil || json.Unmarshal(l.Response.Body, &body) != nil ||
			body.Object != "chat.completion" || len(body.Choices) != 1 || l.Response.RequestID == "" {
			t.Fatalf("%s: %+v", id, l)
		}
	}
	if got := testutil.ToFloat64(s.metrics.lines.WithLabelValues("succeeded")); got != n {
		t.Errorf("stoke_batch_lines_total{result=succeeded} = %v, want %d", got, n)
	}
}

func TestBatchValidationErrors(t *testing.T) {
	r := newRig(t, 1, 8)
	s, _ := r.service(t)
	good := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"x"}]}}`
	content := strings.Join([]string{
		good,
		`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}`, // 2: duplicate
		`{not json`, // 3
		`{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"nope"}}`, // 4: unknown model
		`{"custom_id":"c","method":"GET","url":"/v1/completions","body":{"model":"m"}}`,          // 5: method and url
		``, // 6: blank, skipped
		`{"custom_id":"d","method":"POST","url":"/v1/chat/completions","body":{"model":"m","stream":true}}`, // 7
	}, "\n")
	b := waitFinal(t, r.st, create(t, s, r.upload(t, content), DefaultWindow).ID, 30*time.Second)
	if b.Status != store.BatchFailed || b.At[store.BatchFailed].IsZero() || b.Total != 0 {
		t.Fatalf("batch %s, total %d", b.Status, b.Total)
	}
	var errs []LineError
	if err := json.Unmarshal(b.Errors, &errs); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"duplicate_custom_id": 2, "invalid_json_line": 3, "model_not_found": 4, "invalid_method": 5, "mismatched_endpoint": 5, "invalid_request": 7}
	got := map[string]int{}
	for _, e := range errs {
		if e.Line == nil || e.Message == "" {
			t.Fatalf("error without a line or message: %+v", e)
		}
		got[e.Code] = *e.Line
	}
	for code, line := range want {
		if got[code] != line {
			t.Errorf("%s on line %d, want line %d (all: %+v)", code, got[code], line, got)
		}
	}
}

func TestBatchCreateErrors(t *testing.T) {
	r := newRig(t, 1, 8)
	s, _ := r.service(t)
	file := r.upload(t, input(1, 1))
	for _, tc := range []struct {
		name string
		req  CreateRequest
		want error
	}{
		{"unknown file", CreateRequest{InputFileID: "file-nope", Endpoint: "/v1/completions", CompletionWindow: "24h"}, files.ErrNotFound},
		{"endpoint", CreateRequest{InputFileID: file, Endpoint: "/v1/embeddings", CompletionWindow: "24h"}, ErrInvalid},
		{"window", CreateRequest{InputFileID: file, Endpoint: "/v1/completions", CompletionWindow: "1h"}, ErrInvalid},
		{"no file", CreateRequest{Endpoint: "/v1/completions", CompletionWindow: "24h"}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Create(context.Background(), owner, tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
	b := waitFinal(t, r.st, create(t, s, file, DefaultWindow).ID, 30*time.Second)
	if _, err := s.Cancel(context.Background(), owner, b.ID); !errors.Is(err, ErrNotCancellable) {
		t.Fatalf("cancel of a %s batch: %v", b.Status, err)
	}
	if _, err := s.Cancel(context.Background(), owner, "batch_nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cancel of an unknown batch: %v", err)
	}
}

// TestBatchOwners: a batch belongs to its creator, who alone can get,
// list and cancel it, and whose input file it must be; the runner reads
// the input and writes the output as the batch's owner. Another owner's
// batch or file is not found, with the same message as an unknown id.
func TestBatchOwners(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 1, 8)
	s, _ := r.service(t)
	const a, b = "tenant-a", "tenant-b"
	fileA := r.uploadAs(t, a, input(3, 2))
	if _, err := s.Create(ctx, b, CreateRequest{InputFileID: fileA, Endpoint: "/v1/chat/completions", CompletionWindow: DefaultWindow}); !errors.Is(err, files.ErrNotFound) ||
		err.Error() != "file "+fileA+": no such file" {
		t.Fatalf("create by %s from %s's file: %v, want files.ErrNotFound as for an unknown file", b, a, err)
	}
	ba := createAs(t, s, a, fileA, DefaultWindow)
	if ba.Owner != a {
		t.Fatalf("created batch owner %q, want %q", ba.Owner, a)
	}
	// Nobody's batch (auth off): "" is an owner like any other.
	bn := createAs(t, s, "", r.uploadAs(t, "", input(1, 2)), DefaultWindow)

	wantNotFound := func(what string, err error, id string) {
		t.Helper()
		if !errors.Is(err, ErrNotFound) || err.Error() != "batch "+id+": no such batch" {
			t.Errorf("%s: %v, want ErrNotFound as for an unknown batch", what, err)
		}
	}
	// Refused while it runs: the cancel must change nothing.
	_, err := s.Cancel(ctx, b, ba.ID)
	wantNotFound("cancel by another owner", err, ba.ID)
	_, err = s.Get(ctx, b, ba.ID)
	wantNotFound("get by another owner", err, ba.ID)
	_, err = s.Get(ctx, "", ba.ID)
	wantNotFound("get by no owner", err, ba.ID)
	_, err = s.Get(ctx, a, bn.ID)
	wantNotFound("get of no owner's by a tenant", err, bn.ID)
	_, err = s.Cancel(ctx, a, "batch_nope")
	wantNotFound("cancel of an unknown batch", err, "batch_nope")
	if _, _, err := s.List(ctx, b, ba.ID, 10); !errors.Is(err, ErrNotFound) {
		t.Errorf("list by %s after %s's batch: %v, want ErrNotFound", b, a, err)
	}
	for own, want := range map[string][]string{a: {ba.ID}, "": {bn.ID}, b: nil} {
		page, more, err := s.List(ctx, own, "", 10)
		var ids []string
		for _, x := range page {
			ids = append(ids, x.ID)
		}
		if err != nil || more || fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Errorf("list by %q = %v more=%v (%v), want %v", own, ids, more, err, want)
		}
	}

	done := waitFinal(t, r.st, ba.ID, time.Minute)
	if done.Status != store.BatchCompleted || done.Owner != a {
		t.Fatalf("batch ended %s with owner %q, want completed, %q", done.Status, done.Owner, a)
	}
	out, err := r.fs.Get(ctx, a, done.OutputFileID)
	if err != nil || out.Owner != a || out.Purpose != files.PurposeBatchOutput {
		t.Fatalf("output file for its owner = %+v, %v", out, err)
	}
	if _, err := r.fs.Get(ctx, b, done.OutputFileID); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("output file for another owner: %v, want files.ErrNotFound", err)
	}
	if got, err := s.Get(ctx, a, ba.ID); err != nil || got.Status != store.BatchCompleted {
		t.Errorf("get by its owner = %+v, %v", got, err)
	}
	if done := waitFinal(t, r.st, bn.ID, time.Minute); done.Status != store.BatchCompleted {
		t.Errorf("no owner's batch ended %s", done.Status)
	} else if out, err := r.fs.Get(ctx, "", done.OutputFileID); err != nil || out.Owner != "" {
		t.Errorf("no owner's output file = %+v, %v", out, err)
	}
}

// TestBatchCancelExpireResume: a cancel, an expiry and a runner stopped
// and started again mid-batch each leave every custom_id exactly once
// across the files, and the counts add up.
func TestBatchCancelExpireResume(t *testing.T) {
	const n = 200
	t.Run("cancel", func(t *testing.T) {
		r := newRig(t, 1, 4)
		s, _ := r.service(t)
		b := create(t, s, r.upload(t, input(n, 32)), DefaultWindow)
		waitLines(t, r.st, b.ID, 5)
		if _, err := s.Cancel(context.Background(), owner, b.ID); err != nil {
			t.Fatal(err)
		}
		b = waitFinal(t, r.st, b.ID, time.Minute)
		if b.Status != store.BatchCancelled || b.At[store.BatchCancelling].IsZero() {
			t.Fatalf("batch %s", b.Status)
		}
		_, failed := r.checkExactlyOnce(t, b, n)
		if len(failed) == 0 || b.Completed == 0 {
			t.Fatalf("cancelled with %d completed, %d failed", b.Completed, len(failed))
		}
		for _, l := range failed {
			if l.Error == nil || l.Error.Code != CodeCancelled || l.Response != nil {
				t.Fatalf("cancelled line %+v", l)
			}
		}
	})
	t.Run("expire", func(t *testing.T) {
		r := newRig(t, 1, 4)
		s, _ := r.service(t, "24h", "2s")
		b := waitFinal(t, r.st, create(t, s, r.upload(t, input(n, 64)), "2s").ID, time.Minute)
		if b.Status != store.BatchExpired || b.At[store.BatchExpired].IsZero() {
			t.Fatalf("batch %s", b.Status)
		}
		_, failed := r.checkExactlyOnce(t, b, n)
		for _, l := range failed {
			if l.Error == nil || l.Error.Code != CodeExpired {
				t.Fatalf("expired line %+v", l)
			}
		}
	})
	t.Run("resume", func(t *testing.T) {
		r := newRig(t, 1, 8)
		s, stop := r.service(t)
		b := create(t, s, r.upload(t, input(n, 16)), DefaultWindow)
		waitLines(t, r.st, b.ID, 20)
		stop()
		mid, _ := r.st.Batch(context.Background(), b.ID)
		if mid.Status != store.BatchInProgress || mid.Completed >= n {
			t.Fatalf("stopped at %s with %d done", mid.Status, mid.Completed)
		}
		s2, _ := r.service(t)
		b = waitFinal(t, r.st, b.ID, time.Minute)
		if b.Status != store.BatchCompleted {
			t.Fatalf("resumed batch %s", b.Status)
		}
		r.checkExactlyOnce(t, b, n)
		if testutil.ToFloat64(s2.metrics.resumed) != 1 {
			t.Error("stoke_batch_resumed_total did not count the resumed batch")
		}
	})
}

// waitLines waits until at least n lines of the batch are recorded.
func waitLines(t *testing.T, st *store.Store, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		b, _ := st.Batch(context.Background(), id)
		if b.Completed+b.Failed >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("batch %s recorded fewer than %d lines in a minute", id, n)
}

// TestInteractivePreemptsBatch: with the replica full of batch lines, an
// interactive request takes its room back at once (the newest batch line is
// preempted and requeued), and the batch still finishes with every line
// once.
func TestInteractivePreemptsBatch(t *testing.T) {
	const n = 60
	r := newRig(t, 1, 4)
	s, _ := r.service(t)
	b := create(t, s, r.upload(t, input(n, 32)), DefaultWindow)
	waitLines(t, r.st, b.ID, 4) // the limiter has grown to the replica's room
	for i := range 5 {
		resp, err := http.Post(r.front.URL+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":"interactive %d","max_tokens":4}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("interactive request %d: %d", i, resp.StatusCode)
		}
	}
	b = waitFinal(t, r.st, b.ID, 2*time.Minute)
	if b.Status != store.BatchCompleted {
		t.Fatalf("batch %s", b.Status)
	}
	r.checkExactlyOnce(t, b, n)
	if got := testutil.ToFloat64(s.metrics.preemptions.WithLabelValues(activator.PreemptInteractive)); got == 0 {
		t.Error("no batch line was preempted by interactive requests on a full replica")
	}
}

// TestBatchKeepsToTheKeysModels: a batch created by a key scoped to some
// models fails validation on a line naming another (as the key's own
// request would get 404 model_not_found), even one that is served.
func TestBatchKeepsToTheKeysModels(t *testing.T) {
	r := newRig(t, 1, 8)
	s, _ := r.service(t)
	b, err := s.Create(context.Background(), owner, CreateRequest{InputFileID: r.upload(t, input(2, 1)), Endpoint: "/v1/chat/completions",
		CompletionWindow: DefaultWindow, Models: []string{"another"}})
	if err != nil {
		t.Fatal(err)
	}
	b = waitFinal(t, r.st, b.ID, 30*time.Second)
	var errs []LineError
	json.Unmarshal(b.Errors, &errs)
	if b.Status != store.BatchFailed || len(errs) != 2 || errs[0].Code != "model_not_found" {
		t.Fatalf("batch %s with errors %+v", b.Status, errs)
	}
}

// TestBatchCreateAnswersValidating: Create answers with the batch as
// created, even when the runner it wakes moves the batch on at once (here
// to failed, its one line naming an unknown model).
func TestBatchCreateAnswersValidating(t *testing.T) {
	r := newRig(t, 1, 8)
	s, _ := r.service(t)
	bad := r.upload(t, `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"nope","messages":[{"role":"user","content":"x"}]}}`+"\n")
	for range 40 {
		b := create(t, s, bad, DefaultWindow)
		if b.Status != store.BatchValidating {
			t.Fatalf("Create answered %s, want %s", b.Status, store.BatchValidating)
		}
		if b = waitFinal(t, r.st, b.ID, time.Minute); b.Status != store.BatchFailed {
			t.Fatalf("batch ended %s, want %s", b.Status, store.BatchFailed)
		}
	}
}
