package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/synth"
)

// loadResult is one open-loop run: latencies of the requests that
// succeeded and the count of those that did not.
type loadResult struct {
	lat    []time.Duration
	errors int64
}

func (r loadResult) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// openLoop sends rate requests a second for d (each to url, with a body
// chosen by i), whatever the answers, and times each.
func openLoop(client *http.Client, url string, body func(i int) string, rate int, d time.Duration) loadResult {
	var mu sync.Mutex
	var res loadResult
	var errs atomic.Int64
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			resp, err := client.Post(url, "application/json", strings.NewReader(body(i)))
			if err == nil {
				_, err = io_Discard(resp)
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			if err != nil {
				errs.Add(1)
				return
			}
			mu.Lock()
			res.lat = append(res.lat, time.Since(t))
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.errors = errs.Load()
	return res
}

// io_Discard drains and closes a response body.
func io_Discard(resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	var n int64
	buf := make([]byte, 4096)
	for {
		m, err := resp.Body.Read(buf)
		n += int64(m)
		if err != nil {
			if err.Error() == "EOF" {
				return n, nil
			}
			return n, err
		}
	}
}

// benchServe pushes models (each served by one sim replica, always on) and
// starts stoke serve on sim engines.
func benchServe(b *testing.B, models ...string) string {
	src := filepath.Join(b.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "stoke.yaml"), []byte("replicas:\n  min: 1\n  max: 1\nbuffer:\n  capacity: 10000\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	bucketDir := b.TempDir()
	for _, m := range models {
		if out, err := stoke(b, "push", src, "file://"+bucketDir+"/"+m); err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
	}
	base := startServe(b, nil, "--data", b.TempDir(), "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
		"--warm", "0", "--slots", fmt.Sprint(len(models)), "--sim-profile", "llama-3.1-8b-fp8-h100")
	for _, m := range models {
		waitUntil(b, m+" has a ready replica", 30*time.Second, func() bool { return readyReplicas(b, base, m) == 1 })
	}
	return base
}

// BenchmarkServeOverhead measures the latency stoke serve adds to a
// one-token completion on a sim engine (8B H100 profile), against the same
// engine called directly, at 200 and 1,000 requests/s ($STOKE_BENCH_SECONDS
// each, default 5).
func BenchmarkServeOverhead(b *testing.B) {
	seconds := 5 * time.Second
	if s := os.Getenv("STOKE_BENCH_SECONDS"); s != "" {
		d, err := time.ParseDuration(s + "s")
		if err != nil {
			b.Fatal(err)
		}
		seconds = d
	}
	base := benchServe(b, "chat")
	var rts struct {
		Data []struct {
			Socket string `json:"socket"`
		} `json:"data"`
	}
	getJSON(b, base+"/admin/runtimes", &rts)
	direct := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", rts.Data[0].Socket)
	}}}
	viaServe := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048}}
	body := func(int) string { return `{"model":"chat","prompt":"hello there","max_tokens":1}` }
	for range b.N {
		for _, rate := range []int{200, 1000} {
			d := openLoop(direct, "http://engine/v1/completions", body, rate, seconds)
			s := openLoop(viaServe, base+"/v1/completions", body, rate, seconds)
			b.Logf("%d req/s: engine p50 %.2f ms p99 %.2f ms (%d errors); via serve p50 %.2f ms p99 %.2f ms (%d errors); added p50 %.2f ms p99 %.2f ms",
				rate, ms(d.pct(0.5)), ms(d.pct(0.99)), d.errors, ms(s.pct(0.5)), ms(s.pct(0.99)), s.errors,
				ms(s.pct(0.5)-d.pct(0.5)), ms(s.pct(0.99)-d.pct(0.99)))
			b.ReportMetric(ms(s.pct(0.5)-d.pct(0.5)), fmt.Sprintf("added_p50_ms@%d", rate))
			b.ReportMetric(ms(s.pct(0.99)-d.pct(0.99)), fmt.Sprintf("added_p99_ms@%d", rate))
		}
	}
}

// BenchmarkServeThreeModels raises the rate of one-token completions
// spread over 3 models on sim engines and reports the highest rate served
// with no errors.
func BenchmarkServeThreeModels(b *testing.B) {
	base := benchServe(b, "m1", "m2", "m3")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096}}
	body := func(i int) string { return fmt.Sprintf(`{"model":"m%d","prompt":"hello there","max_tokens":1}`, i%3+1) }
	for range b.N {
		best := 0
		for _, rate := range []int{1000, 2000, 3000, 4000, 6000} {
			r := openLoop(client, base+"/v1/completions", body, rate, 5*time.Second)
			b.Logf("%d req/s over 3 models: %d ok, %d errors, p50 %.2f ms, p99 %.2f ms", rate, len(r.lat), r.errors, ms(r.pct(0.5)), ms(r.pct(0.99)))
			if r.errors > 0 {
				break
			}
			best = rate
		}
		b.ReportMetric(float64(best), "max_req/s_no_errors")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
