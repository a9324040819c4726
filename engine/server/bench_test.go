package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/sim"
	"github.com/stokehq/stoke/engine/tokenizer"
)

// BenchmarkSimShortRequestsHTTP measures how many short completions per
// second one sim engine (8B FP8 on H100 profile, real step times) serves
// over HTTP on this machine with 256 clients: the server, JSON,
// tokenizer and engine loop all on this CPU, the GPU simulated.
func BenchmarkSimShortRequestsHTTP(b *testing.B) {
	p, err := sim.LoadProfile("llama-3.1-8b-fp8-h100")
	if err != nil {
		b.Fatal(err)
	}
	tj, tc, err := tokenizer.Synthesize(p.VocabSize, 1)
	if err != nil {
		b.Fatal(err)
	}
	tok, err := tokenizer.New(tj, tc)
	if err != nil {
		b.Fatal(err)
	}
	loader := func(context.Context, engineapi.LoadRequest, func(engineapi.LoadProgress)) (*Loaded, error) {
		return &Loaded{
			Name: p.Model, Tokenizer: tok, MaxModelLen: p.MaxModelLen,
			Start: func(m *core.Metrics) (*core.Engine, error) {
				cfg := core.Config{Sched: sched.Config{MaxNumBatchedTokens: 8192, MaxNumSeqs: p.MaxNumSeqs, MaxModelLen: p.MaxModelLen}}
				return core.New(cfg, kvcache.NewManager(p.KVCapacityTokens/kvcache.BlockSize, true), core.NewSimExecutor(p, tok, nil), tok, m)
			},
			Close: func() error { return nil },
		}, nil
	}
	srv, err := New(Options{Loader: loader, Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Load(context.Background(), engineapi.LoadRequest{Path: "sim"}); err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	defer srv.Shutdown(context.Background())
	const clients = 256
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: time.Minute}
	body := []byte(`{"model":"` + p.Model + `","prompt":"Summarise this note in one short sentence, please.","max_tokens":16,"ignore_eos":true}`)
	var next sync.Mutex
	remaining := b.N
	b.ResetTimer()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				if remaining == 0 {
					next.Unlock()
					return
				}
				remaining--
				next.Unlock()
				resp, err := client.Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
}
