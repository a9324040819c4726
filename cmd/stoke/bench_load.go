package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vbauerster/cupwriter"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/stokehq/stoke/bench/load"
)

// newBenchLoadCmd is `stoke bench load`.
func newBenchLoadCmd() *cobra.Command {
	var (
		o                       load.Options
		input, output, slo, key string
		asJSON                  bool
	)
	cmd := &cobra.Command{
		Use:   "load --url URL --model NAME (--rate R | --concurrency C)",
		Short: "Load any OpenAI-compatible server and report TTFT, TPOT, ITL, E2E and goodput",
		Long: `Load sends streamed completions to URL (stoke serve, a stoke engine, or
another OpenAI-compatible server): open-loop arrivals at --rate a second
(Poisson, or gamma with --burstiness: below 1 burstier), or --concurrency
clients in a closed loop, for --duration or --requests. Prompt and answer
lengths come from --input-tokens and --output-tokens: N, fixed:N,
uniform:A-B, normal:MEAN,SD or lognormal:MEDIAN,SIGMA (answers are held to
their length with ignore_eos). It reports, as vllm bench serve defines and
names them: TTFT (to the first event with text), TPOT ((E2E − TTFT) /
(tokens − 1)), ITL (gaps between events), E2E latency, request and token
throughput, errors by code, and goodput against --slo (ttft=800ms,tpot=40ms).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Input, err = load.ParseDist(input); err != nil {
				return fmt.Errorf("--input-tokens: %w", err)
			}
			if o.Output, err = load.ParseDist(output); err != nil {
				return fmt.Errorf("--output-tokens: %w", err)
			}
			bounds, err := parseSLO(slo)
			if err != nil {
				return err
			}
			if o.Rate <= 0 && o.Concurrency <= 0 {
				return fmt.Errorf("give --rate or --concurrency")
			}
			if o.APIKey = key; o.APIKey == "" {
				o.APIKey = os.Getenv("OPENAI_API_KEY")
			}
			stop := progress(cmd.ErrOrStderr(), &o, asJSON)
			results, took, err := load.Run(cmd.Context(), o)
			stop()
			if err != nil {
				return err
			}
			rep := load.Summarize(results, took, bounds)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			writeLoadReport(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.URL, "url", "http://127.0.0.1:8080", "the server's base URL")
	f.StringVar(&o.Model, "model", "", "the model requests name")
	f.StringVar(&key, "api-key", "", "bearer key (default: $OPENAI_API_KEY)")
	f.Float64Var(&o.Rate, "rate", 0, "open loop: mean requests a second")
	f.Float64Var(&o.Burstiness, "burstiness", 1, "open loop: gamma shape of the gaps (1: Poisson)")
	f.IntVar(&o.Concurrency, "concurrency", 0, "closed loop: clients, each sending when its last request ends")
	f.DurationVar(&o.Duration, "duration", 30*time.Second, "how long to send")
	f.IntVar(&o.Requests, "requests", 0, "how many requests to send at most (0: as many as the duration takes)")
	f.StringVar(&input, "input-tokens", "128", "prompt length distribution")
	f.StringVar(&output, "output-tokens", "128", "answer length distribution")
	f.StringVar(&slo, "slo", "ttft=800ms,tpot=40ms", "goodput bounds: ttft=, tpot=, e2el= (comma-separated)")
	f.Uint64Var(&o.Seed, "seed", 0, "seed of arrivals and lengths (0: random)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.MarkFlagRequired("model")
	return cmd
}

// parseSLO reads ttft=800ms,tpot=40ms,e2el=5s.
func parseSLO(s string) (load.SLO, error) {
	var slo load.SLO
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if !ok || err != nil || d <= 0 {
			return slo, fmt.Errorf("--slo: %q: want name=duration, as ttft=800ms", part)
		}
		switch strings.TrimSpace(k) {
		case "ttft":
			slo.TTFT = d
		case "tpot":
			slo.TPOT = d
		case "e2el":
			slo.E2E = d
		default:
			return slo, fmt.Errorf("--slo: %q: the bounds are ttft, tpot and e2el", k)
		}
	}
	return slo, nil
}

// progress shows a bar of the requests answered on w while the load runs
// (not with --json, and not when w is no terminal) and returns its stop.
func progress(w io.Writer, o *load.Options, quiet bool) func() {
	if quiet {
		return func() {}
	}
	if !cupwriter.New(w, false).IsTerminal() {
		return func() {}
	}
	total := int64(o.Requests)
	if total == 0 {
		total = int64(o.Duration.Seconds() * max(o.Rate, 1))
	}
	p := mpb.New(mpb.WithOutput(w))
	bar := p.AddBar(total, mpb.PrependDecorators(decor.Name("requests "), decor.CountersNoUnit("%d / %d")),
		mpb.AppendDecorators(decor.Elapsed(decor.ET_STYLE_GO)))
	prev := o.OnResult
	o.OnResult = func(r load.Result) {
		bar.Increment()
		if prev != nil {
			prev(r)
		}
	}
	return func() {
		bar.SetTotal(-1, true)
		p.Wait()
	}
}

// writeLoadReport prints a report as vllm bench serve lays its out.
func writeLoadReport(w io.Writer, r load.Report) {
	line := func(name string, format string, v any) { fmt.Fprintf(w, "%-40s "+format+"\n", name+":", v) }
	fmt.Fprintln(w, "============ Serving Benchmark Result ============")
	line("Successful requests", "%d", r.Completed)
	line("Failed requests", "%d", r.Failed)
	for code, n := range r.Errors {
		line("  "+code, "%d", n)
	}
	line("Benchmark duration (s)", "%.2f", r.Duration)
	line("Total input tokens", "%d", r.TotalInputTokens)
	line("Total generated tokens", "%d", r.TotalOutputTokens)
	line("Request throughput (req/s)", "%.2f", r.RequestThroughput)
	line("Request goodput (req/s)", "%.2f", r.RequestGoodput)
	line("Output token throughput (tok/s)", "%.2f", r.OutputThroughput)
	line("Total Token throughput (tok/s)", "%.2f", r.TotalTokenThroughput)
	for _, m := range []struct {
		title, short string
		s            load.Stats
	}{
		{"Time to First Token", "TTFT", r.TTFT}, {"Time per Output Token (excl. 1st token)", "TPOT", r.TPOT},
		{"Inter-token Latency", "ITL", r.ITL}, {"End-to-end Latency", "E2EL", r.E2E},
	} {
		fmt.Fprintf(w, "%s\n", center(m.title))
		line("Mean "+m.short+" (ms)", "%.2f", m.s.Mean)
		line("Median "+m.short+" (ms)", "%.2f", m.s.Median)
		line("P90 "+m.short+" (ms)", "%.2f", m.s.P90)
		line("P99 "+m.short+" (ms)", "%.2f", m.s.P99)
	}
	fmt.Fprintln(w, "==================================================")
}

// center frames a section title as vLLM's report does.
func center(title string) string {
	const width = 50
	pad := max(0, width-len(title)-2)
	return strings.Repeat("-", pad/2) + " " + title + " " + strings.Repeat("-", pad-pad/2)
}
