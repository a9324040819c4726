package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/stokehq/stoke/runtime/spot/spottest"
)

// TestServeBatchChaos runs a 10,000-line batch on sim engines while (a) a
// burst of interactive requests takes capacity back from it, (b) AWS's EC2
// metadata mock serves a spot interruption notice, and (c) serve is
// SIGKILLed and started again: every custom_id appears exactly once across
// the output and error files, none is missing, and request_counts add up.
func TestServeBatchChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("a 10,000-line batch: not in -short")
	}
	mock := spottest.Binary(t)
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 4\n")
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	imdsAddr := freeAddr(t)
	args := []string{"--data", data, "--bucket", "file://" + bucketDir, "--watch-interval", "100ms", "--warm", "0",
		"--slots", "4", "--spot-slots", "2", "--spot-imds", "http://" + imdsAddr, "--max-num-seqs", "8",
		"--sim-profile", "llama-3.1-8b-fp8-h100"}
	first := launchServe(t, nil, freeAddr(t), args...)
	first.waitHealthy(t)
	ctx := context.Background()
	client := func(base string) *oai.Client {
		c := oai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
		return &c
	}

	const n = 10_000
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"c-%d","method":"POST","url":"/v1/completions","body":{"model":"chat","prompt":"line %d","max_tokens":4}}`+"\n", i, i)
	}
	f, err := client(first.base).Files.New(ctx, oai.FileNewParams{File: oai.File(strings.NewReader(in.String()), "big.jsonl", "application/jsonl"), Purpose: oai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	b, err := client(first.base).Batches.New(ctx, oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1Completions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	done := func(base string) int64 {
		got, err := client(base).Batches.Get(ctx, b.ID)
		if err != nil {
			return 0
		}
		return got.RequestCounts.Completed + got.RequestCounts.Failed
	}
	start := time.Now()
	waitUntil(t, "1,000 lines are done", 3*time.Minute, func() bool { return done(first.base) >= 1000 })
	t.Logf("1,000 lines done after %v", time.Since(start))

	// (a) Interactive demand: bursts that must all be answered, taking
	// room back from batch lines. The batch runner adapts how many lines
	// it keeps in flight to their latency, so on a busy machine a burst may
	// find free slots and take no line's: bursts go on until one has.
	var failures atomic.Int32
	burst := func() {
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 10 {
					resp, err := http.Post(first.base+"/v1/completions", "application/json",
						strings.NewReader(fmt.Sprintf(`{"model":"chat","prompt":"interactive %d-%d","max_tokens":4}`, w, i)))
					if err != nil {
						failures.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failures.Add(1)
					}
				}
			}()
		}
		wg.Wait()
	}
	bursts := 0
	waitUntil(t, "interactive requests on full replicas preempt a batch line", 2*time.Minute, func() bool {
		burst()
		bursts++
		return metricValue(t, first.base, `stoke_batch_preemptions_total{cause="interactive"}`) > 0 || done(first.base) >= 2500
	})
	if n := failures.Load(); n > 0 {
		t.Errorf("%d of %d interactive requests failed during the batch", n, 160*bursts)
	}
	if got := metricValue(t, first.base, `stoke_batch_preemptions_total{cause="interactive"}`); got == 0 {
		t.Errorf("%d bursts of interactive requests preempted no batch line", bursts)
	}

	// (b) A spot interruption notice from AWS's metadata mock, once the
	// batch has grown onto a spot slot: serve drains its spot slots.
	onSpot := func() (n int) {
		for _, r := range listRuntimes(t, first.base) {
			if r.Class == "spot" && r.State == "ready" {
				n++
			}
		}
		return n
	}
	waitUntil(t, "a replica is ready on a spot slot", 2*time.Minute, func() bool { return onSpot() > 0 })
	spot := exec.Command(mock, "spot", "--action", "terminate", "-d", "1", "-p", strings.Split(imdsAddr, ":")[1], "-I")
	spot.Stdout, spot.Stderr = io.Discard, io.Discard
	if err := spot.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { spot.Process.Kill(); spot.Wait() })
	waitUntil(t, "serve drains its spot slots", time.Minute, func() bool {
		return metricValue(t, first.base, "stoke_spot_drains_total") >= 1
	})
	spotPreempted := metricValue(t, first.base, `stoke_batch_preemptions_total{cause="spot"}`)
	t.Logf("spot drain after %v, %d lines done, %v batch lines preempted by it", time.Since(start), done(first.base), spotPreempted)
	if spotPreempted == 0 {
		t.Error("the spot drain preempted no batch line on the spot replicas")
	}
	if n := onSpot(); n > 0 {
		t.Errorf("%d replicas still ready on spot slots after the drain", n)
	}

	// (c) serve killed mid-batch and started again.
	waitUntil(t, "3,000 lines are done", 3*time.Minute, func() bool { return done(first.base) >= 3000 })
	t.Logf("SIGKILL after %v", time.Since(start))
	syscall.Kill(first.cmd.Process.Pid, syscall.SIGKILL)
	<-first.done
	second := launchServe(t, nil, freeAddr(t), args...)
	second.waitHealthy(t)
	c := client(second.base)
	waitUntil(t, "the batch completes after the restart", 5*time.Minute, func() bool {
		got, err := c.Batches.Get(ctx, b.ID)
		return err == nil && got.Status == oai.BatchStatusCompleted
	})
	t.Logf("completed after %v", time.Since(start))
	if got := metricValue(t, second.base, "stoke_batch_resumed_total"); got != 1 {
		t.Errorf("stoke_batch_resumed_total = %v after the restart, want 1", got)
	}
	final, err := c.Batches.Get(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	var lines []batchOutputLine
	for _, id := range []string{final.OutputFileID, final.ErrorFileID} {
		if id != "" {
			lines = append(lines, readBatchFile(t, *c, id)...)
		}
	}
	for _, l := range lines {
		seen[l.CustomID]++
	}
	for i := range n {
		if k := seen[fmt.Sprintf("c-%d", i)]; k != 1 {
			t.Fatalf("custom_id c-%d appears %d times across the files", i, k)
		}
	}
	rc := final.RequestCounts
	if len(seen) != n || rc.Total != n || rc.Completed+rc.Failed != n || len(lines) != n {
		t.Fatalf("%d ids in %d lines; request_counts %+v", len(seen), len(lines), rc)
	}
	if rc.Failed != 0 {
		t.Errorf("%d lines failed; every line should have been answered", rc.Failed)
	}
}
