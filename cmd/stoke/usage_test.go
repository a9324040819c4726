package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/store"
)

// usageLoad sends completions (plain, streamed with usage in the stream,
// and streamed without) from 16 workers until stop is closed or a request
// fails, and returns the request ids of the answers it read whole with a
// 200.
func usageLoad(base string, stop <-chan struct{}) []string {
	var mu sync.Mutex
	var answered []string
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				stream := i%3 != 0
				body := fmt.Sprintf(`{"model":"chat","prompt":"worker %d request %d","max_tokens":8}`, w, i)
				switch i % 3 {
				case 1:
					body = fmt.Sprintf(`{"model":"chat","prompt":"worker %d request %d","max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`, w, i)
				case 2:
					body = fmt.Sprintf(`{"model":"chat","prompt":"worker %d request %d","max_tokens":8,"stream":true}`, w, i)
				}
				resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					return
				}
				data, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				whole := err == nil && resp.StatusCode == http.StatusOK &&
					(!stream && strings.HasSuffix(strings.TrimSpace(string(data)), "}") || stream && strings.HasSuffix(string(data), "data: [DONE]\n\n"))
				if !whole {
					return
				}
				mu.Lock()
				answered = append(answered, resp.Header.Get("X-Request-Id"))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return answered
}

// engineTokens sums the prompt and generated tokens every engine of base
// counted (vLLM's counters on their own /metrics).
func engineTokens(t *testing.T, base string) int64 {
	t.Helper()
	var total int64
	for _, r := range listRuntimes(t, base) {
		if r.State != "ready" {
			continue
		}
		path := strings.TrimPrefix(r.Socket, "unix://")
		client := &http.Client{Transport: unixTransport(path, 0)}
		resp, err := client.Get("http://engine/metrics")
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "vllm:prompt_tokens_total") || strings.HasPrefix(line, "vllm:generation_tokens_total") {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				total += int64(v)
			}
		}
		resp.Body.Close()
	}
	return total
}

// TestServeUsageRecords: after a load test the usage records add up
// exactly to the engines' own token counters, and the operating cost per
// million tokens is the replicas' cost over them; and with serve SIGKILLed
// under load, every answer a client read whole has its record, once, and
// no record is partial.
func TestServeUsageRecords(t *testing.T) {
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 1\n  max: 1\ncost:\n  replica_hourly_usd: 3.6\n")
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	args := []string{"--data", data, "--bucket", "file://" + bucketDir, "--watch-interval", "100ms", "--warm", "0", "--slots", "1",
		"--sim-profile", "llama-3.1-8b-fp8-h100"}
	s := launchServe(t, nil, freeAddr(t), args...)
	s.waitHealthy(t)
	waitUntil(t, "chat has a ready replica", 60*time.Second, func() bool { return readyReplicas(t, s.base, "chat") == 1 })

	before := engineTokens(t, s.base) // the runtime manager's own probe after a load
	stop := make(chan struct{})
	time.AfterFunc(2*time.Second, func() { close(stop) })
	answered := usageLoad(s.base, stop)
	var totals struct {
		Data []struct {
			Requests   int   `json:"requests"`
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		}
	}
	getJSON(t, s.base+"/admin/usage", &totals) // serve's own store: its journal and table
	var recorded int64
	requests := 0
	for _, u := range totals.Data {
		recorded += u.Prompt + u.Completion
		requests += u.Requests
	}
	if engine := engineTokens(t, s.base) - before; recorded != engine || requests != len(answered) || requests == 0 {
		t.Fatalf("usage records: %d requests, %d tokens; the clients read %d answers, the engines counted %d tokens",
			requests, recorded, len(answered), engine)
	}
	// One replica at $3.60 an hour costs a thousandth of a dollar a second.
	metric := scrape(t, s.base)
	seconds, usd := metric(`stoke_replica_seconds_total{model="chat"}`), metric(`stoke_operating_cost_usd_total{model="chat"}`)
	per1M := metric(`stoke_cost_per_1m_tokens{model="chat"}`)
	served := metric(`stoke_tokens_total{kind="completion",model="chat"}`) + metric(`stoke_tokens_total{kind="prompt",model="chat"}`)
	if seconds < 2 || math.Abs(usd-seconds/1000) > 1e-6 || per1M <= 0 || math.Abs(per1M-usd/served*1e6) > 0.01*per1M {
		t.Fatalf("replica-seconds %v, cost $%v, $%v per 1M tokens over %v tokens served: want cost = seconds/1000, and cost/tokens", seconds, usd, per1M, served)
	}

	var killed atomic.Bool
	stop = make(chan struct{})
	time.AfterFunc(1500*time.Millisecond, func() {
		killed.Store(true)
		syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
		close(stop)
	})
	more := usageLoad(s.base, stop)
	<-s.done
	st, err := store.Open(context.Background(), filepath.Join(data, "state.db")) // replays the journal serve left
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ids, err := st.UsageRequestIDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all := append(answered, more...)
	for _, id := range all {
		if ids[id] != 1 {
			t.Fatalf("answered request %s has %d usage records after the SIGKILL", id, ids[id])
		}
	}
	after, _ := st.UsageTotals(context.Background(), store.UsageQuery{})
	for _, u := range after {
		if u.Requests > 0 && (u.PromptTokens == 0 || u.CompletionTokens == 0) {
			t.Fatalf("a partial record: %+v", u)
		}
	}
	t.Logf("%d answers before and %d during the run SIGKILLed, %d records", len(answered), len(more), len(ids))
}
