package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"
)

// streamTTFT sends rate streamed completions of maxTokens a second for d
// (with key, when set; each prompt a request named by the call and its
// number, so no two share a cached prefix, and then context) and returns
// their times to first token (the first SSE data event).
func streamTTFT(base, key, context string, rate, maxTokens int, d time.Duration) loadResult {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}, Timeout: 2 * time.Minute}
	call := rand.Uint32()
	return openLoopFunc(rate, d, func(i int) (time.Duration, error) {
		t := time.Now()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"chat","prompt":"request %x-%d%s","max_tokens":%d,"stream":true}`, call, i, context, maxTokens)))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var first time.Duration
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if first == 0 && strings.HasPrefix(sc.Text(), "data: ") {
				first = time.Since(t)
			}
		}
		if resp.StatusCode != http.StatusOK || first == 0 {
			return 0, fmt.Errorf("status %d", resp.StatusCode)
		}
		return first, nil
	})
}

// BenchmarkTenantFairness measures a light tenant's p90 TTFT alone and
// beside a heavy tenant sending ten times its rate with longer answers,
// on one sim replica of 16 requests' room that the heavy tenant overfills
// (so the activator's buffer queues, and the slot shares keep room for the
// light tenant). The light tenant's prompts are short (a TTFT of one
// engine step) or carry ~500 tokens of context (a chat turn);
// $STOKE_BENCH_SECONDS sets each phase (default 6).
func BenchmarkTenantFairness(b *testing.B) {
	phase := benchSeconds(b, 6)
	for _, shape := range []struct{ name, context string }{
		{"prompt=short", ""},
		{"prompt=context", strings.Repeat(" and then", 160)},
	} {
		b.Run(shape.name, func(b *testing.B) {
			base := benchServeWith(b, []string{"--max-num-seqs", "16"}, "chat")
			keys := map[string]string{}
			for _, name := range []string{"light", "heavy"} {
				if code := adminPostB(b, base, "", "/admin/tenants", `{"name":"`+name+`"}`, nil); code != 200 {
					b.Fatalf("create tenant: %d", code)
				}
				var k struct{ Key string }
				adminPostB(b, base, "", "/admin/keys", `{"tenant":"`+name+`"}`, &k)
				keys[name] = k.Key
			}
			const lightRate = 10
			for range b.N {
				alone := streamTTFT(base, keys["light"], shape.context, lightRate, 4, phase)
				heavyDone := make(chan loadResult)
				go func() { heavyDone <- streamTTFT(base, keys["heavy"], "", 10*lightRate, 64, phase+2*time.Second) }()
				time.Sleep(time.Second) // the heavy tenant's backlog builds
				shared := streamTTFT(base, keys["light"], shape.context, lightRate, 4, phase)
				heavy := <-heavyDone
				b.Logf("light p90 TTFT alone %.1f ms, beside a tenant at 10x its rate %.1f ms (%.2fx); heavy p90 %.1f ms; errors %d/%d/%d",
					ms(alone.pct(0.9)), ms(shared.pct(0.9)), float64(shared.pct(0.9))/float64(alone.pct(0.9)), ms(heavy.pct(0.9)),
					alone.errors, shared.errors, heavy.errors)
				b.ReportMetric(ms(alone.pct(0.9)), "light-alone-p90-ms")
				b.ReportMetric(ms(shared.pct(0.9)), "light-shared-p90-ms")
				b.ReportMetric(ms(heavy.pct(0.9)), "heavy-p90-ms")
			}
		})
	}
}
