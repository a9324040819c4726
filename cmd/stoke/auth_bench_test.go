package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// instantProfile is a sim latency profile whose steps take next to no
// time, so a benchmark of the gateway measures the gateway, not where in
// an engine step each request lands.
const instantProfile = `name: instant
model: none
hardware: none
sources: ["a benchmark's: steps of 20 us"]
step_overhead: 20us
prefill_per_token: 1ns
decode_per_seq: 1ns
decode_per_context_token: 1ns
kv_capacity_tokens: 491520
max_num_seqs: 256
max_model_len: 8192
vocab_size: 128256
`

// BenchmarkGatewayTenancy measures the latency keys, limits and usage
// records add to a one-token completion at 1,000 requests/s: serve with
// --auth=none --no-usage-records against serve with a tenant with
// (generous) limits and its key, usage records on (a loopback serve with
// no admin key, its /admin open). Both run sim engines whose steps take
// 20 us, side by side, and take the load in turns (off, on, off, on) so
// drift on the machine falls on both. $STOKE_BENCH_SECONDS sets each
// configuration's total (default 6); $STOKE_BENCH_NO_USAGE=1 leaves usage
// records off in the second one too.
func BenchmarkGatewayTenancy(b *testing.B) {
	seconds := benchSeconds(b, 6)
	profile := filepath.Join(b.TempDir(), "instant.yaml")
	if err := os.WriteFile(profile, []byte(instantProfile), 0o644); err != nil {
		b.Fatal(err)
	}
	run := func(base, key string, d time.Duration) loadResult {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048}}
		return openLoopFunc(1000, d, func(int) (time.Duration, error) {
			t := time.Now()
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(`{"model":"chat","prompt":"hello there","max_tokens":1}`))
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			resp, err := client.Do(req)
			if err == nil {
				_, err = io_Discard(resp)
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			return time.Since(t), err
		})
	}
	offBase := benchServeWith(b, []string{"--sim-profile", profile, "--auth", "none", "--no-usage-records"}, "chat")
	onFlags := []string{"--sim-profile", profile}
	if os.Getenv("STOKE_BENCH_NO_USAGE") != "" {
		onFlags = append(onFlags, "--no-usage-records")
	}
	onBase := benchServeWith(b, onFlags, "chat")
	if code := adminPostB(b, onBase, "", "/admin/tenants", `{"name":"bench","limits":{"requests_per_minute":10000000,"tokens_per_minute":1000000000}}`, nil); code != 200 {
		b.Fatalf("create tenant: %d", code)
	}
	var key struct{ Key string }
	adminPostB(b, onBase, "", "/admin/keys", `{"tenant":"bench","limits":{"max_concurrent":100000}}`, &key)
	run(offBase, "", time.Second) // warm both: connections, the engines' first steps
	run(onBase, key.Key, time.Second)
	const turns = 4
	for range b.N {
		var off, on loadResult
		for range turns {
			off.merge(run(offBase, "", seconds/turns))
			on.merge(run(onBase, key.Key, seconds/turns))
		}
		b.Logf("1000 req/s: off p50 %.3f ms p99 %.3f ms (%d errors); keys+limits+usage p50 %.3f ms p99 %.3f ms (%d errors)",
			ms(off.pct(0.5)), ms(off.pct(0.99)), off.errors, ms(on.pct(0.5)), ms(on.pct(0.99)), on.errors)
		b.ReportMetric(ms(on.pct(0.5)-off.pct(0.5)), "added_p50_ms")
		b.ReportMetric(ms(on.pct(0.99)-off.pct(0.99)), "added_p99_ms")
	}
}
