package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// BenchmarkBatchInteractiveTTFT measures interactive TTFT (p50, p99) at a
// fixed rate on one sim replica (8B H100 profile) with and without a large
// batch running on the same node, and the batch's lines/s alone and
// meanwhile.
// $STOKE_BENCH_SECONDS sets each phase's length (default 10), $STOKE_BENCH_RATE
// the interactive rate (default 20/s), $STOKE_BENCH_BATCH_IN_FLIGHT and
// $STOKE_BENCH_LOWER_PREFILL serve's --batch-max-in-flight and
// --lower-priority-prefill-tokens.
func BenchmarkBatchInteractiveTTFT(b *testing.B) {
	rate := 20
	if r, err := strconv.Atoi(os.Getenv("STOKE_BENCH_RATE")); err == nil && r > 0 {
		rate = r
	}
	phase := benchSeconds(b, 10)
	var flags []string
	if v := os.Getenv("STOKE_BENCH_BATCH_IN_FLIGHT"); v != "" {
		flags = append(flags, "--batch-max-in-flight", v)
	}
	if v := os.Getenv("STOKE_BENCH_LOWER_PREFILL"); v != "" {
		flags = append(flags, "--lower-priority-prefill-tokens", v)
	}
	base := benchServeWith(b, flags, "chat")
	ctx := context.Background()
	client := oai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	for b.Loop() {
		alone := streamTTFT(base, "", "", rate, 16, phase)

		var in strings.Builder
		for i := range 50_000 {
			fmt.Fprintf(&in, `{"custom_id":"c-%d","method":"POST","url":"/v1/completions","body":{"model":"chat","prompt":"batch line %d: classify this short review as positive or negative.","max_tokens":16}}`+"\n", i, i)
		}
		f, err := client.Files.New(ctx, oai.FileNewParams{File: oai.File(strings.NewReader(in.String()), "big.jsonl", "application/jsonl"), Purpose: oai.FilePurposeBatch})
		if err != nil {
			b.Fatal(err)
		}
		bt, err := client.Batches.New(ctx, oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1Completions,
			CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
		if err != nil {
			b.Fatal(err)
		}
		counts := func() int64 {
			got, err := client.Batches.Get(ctx, bt.ID)
			if err != nil {
				b.Fatal(err)
			}
			return got.RequestCounts.Completed + got.RequestCounts.Failed
		}
		waitUntil(b, "the batch runs", time.Minute, func() bool { return counts() > 500 })
		before, t0 := counts(), time.Now()
		time.Sleep(phase / 2)
		aloneLines := float64(counts()-before) / time.Since(t0).Seconds()
		before, t0 = counts(), time.Now()
		with := streamTTFT(base, "", "", rate, 16, phase)
		linesPerSec := float64(counts()-before) / time.Since(t0).Seconds()
		client.Batches.Cancel(ctx, bt.ID)

		b.ReportMetric(ms(alone.pct(0.5)), "alone-p50-ms")
		b.ReportMetric(ms(alone.pct(0.99)), "alone-p99-ms")
		b.ReportMetric(ms(with.pct(0.5)), "batch-p50-ms")
		b.ReportMetric(ms(with.pct(0.99)), "batch-p99-ms")
		b.ReportMetric(aloneLines, "batch-alone-lines/s")
		b.ReportMetric(linesPerSec, "batch-lines/s")
		b.ReportMetric(float64(alone.errors+with.errors), "errors")
	}
}
