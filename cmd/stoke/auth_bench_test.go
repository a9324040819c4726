package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// BenchmarkGatewayTenancy measures the latency keys, limits and usage
// records add to a one-token completion on a sim engine at 1,000
// requests/s: serve with --auth=none --no-usage-records against serve
// with a tenant with (generous) limits and its key, usage records on (a
// loopback serve with no admin key, its /admin open).
// $STOKE_BENCH_SECONDS sets each run's length (default 5);
// $STOKE_BENCH_NO_USAGE=1 leaves usage records off in the second run too.
func BenchmarkGatewayTenancy(b *testing.B) {
	seconds := benchSeconds(b, 5)
	run := func(base, key string) loadResult {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048}}
		return openLoopFunc(1000, seconds, func(int) (time.Duration, error) {
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
	for range b.N {
		off := run(benchServeWith(b, []string{"--auth", "none", "--no-usage-records"}, "chat"), "")
		// A loopback serve with no admin key: /admin is open, and /v1 takes
		// keys once one exists.
		var onFlags []string
		if os.Getenv("STOKE_BENCH_NO_USAGE") != "" {
			onFlags = []string{"--no-usage-records"}
		}
		base := benchServeWith(b, onFlags, "chat")
		if code := adminPostB(b, base, "", "/admin/tenants", `{"name":"bench","limits":{"requests_per_minute":10000000,"tokens_per_minute":1000000000}}`, nil); code != 200 {
			b.Fatalf("create tenant: %d", code)
		}
		var key struct{ Key string }
		adminPostB(b, base, "", "/admin/keys", `{"tenant":"bench","limits":{"max_concurrent":100000}}`, &key)
		on := run(base, key.Key)
		b.Logf("1000 req/s: off p50 %.3f ms p99 %.3f ms (%d errors); keys+limits+usage p50 %.3f ms p99 %.3f ms (%d errors)",
			ms(off.pct(0.5)), ms(off.pct(0.99)), off.errors, ms(on.pct(0.5)), ms(on.pct(0.99)), on.errors)
		b.ReportMetric(ms(on.pct(0.5)-off.pct(0.5)), "added_p50_ms")
		b.ReportMetric(ms(on.pct(0.99)-off.pct(0.99)), "added_p99_ms")
	}
}
