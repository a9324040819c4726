package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vbauerster/cupwriter"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/stokehq/stoke/bench/load"
)

// benchLoadFlags are `stoke bench load`'s flags as given.
type benchLoadFlags struct {
	o                                      load.Options
	models, input, output, slo, key, trace string
	sweep, out                             string
	pause                                  time.Duration
	asJSON                                 bool
}

// newBenchLoadCmd is `stoke bench load`.
func newBenchLoadCmd() *cobra.Command {
	var fl benchLoadFlags
	cmd := &cobra.Command{
		Use:   "load --url URL --model NAME[,NAME…] (--rate R | --concurrency C | --trace FILE | --sweep rate=R1,R2,…)",
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
throughput, errors by code, and goodput against --slo (ttft=800ms,tpot=40ms).

Mixes: --model a,b,c names the models in turn, --model a=3,b=1 draws them
by weight; the report breaks down by model. --prefix-tokens N starts every
prompt with one of --prefix-groups fixed prefixes of about N tokens (a
shared-prefix load) before its own --input-tokens. --trace FILE replays a
JSONL trace, a request a line: {"time": SECONDS, "model": "…",
"input_tokens": N, "output_tokens": M} (model optional), at its times
divided by --trace-speed.

Sweeps: --sweep rate=1,2,4,8 (or concurrency=1,4,16,64) runs one load a
value, each for --duration or --requests with --sweep-pause between, prints
a row a point, the knee (the highest load whose p99 TTFT is within 1.5× the
lowest load's) and the highest load at which 90% of requests meet --slo,
and writes sweep.json, sweep.png and sweep.html into --out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bounds, err := fl.options(cmd.Flags())
			if err != nil {
				return err
			}
			if fl.sweep != "" {
				return runBenchSweep(cmd, &fl, bounds)
			}
			stop := progress(cmd.ErrOrStderr(), &fl.o, fl.asJSON)
			results, took, err := load.Run(cmd.Context(), fl.o)
			stop()
			if err != nil {
				return err
			}
			rep := load.Summarize(results, took, bounds)
			if fl.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			writeLoadReport(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	f := cmd.Flags()
	o := &fl.o
	f.StringVar(&o.URL, "url", "http://127.0.0.1:8080", "the server's base URL")
	f.StringVar(&fl.models, "model", "", "the model requests name; a,b,c for several in turn, a=3,b=1 to draw them by weight")
	f.StringVar(&fl.key, "api-key", "", "bearer key (default: $OPENAI_API_KEY)")
	f.Float64Var(&o.Rate, "rate", 0, "open loop: mean requests a second")
	f.Float64Var(&o.Burstiness, "burstiness", 1, "open loop: gamma shape of the gaps (1: Poisson)")
	f.IntVar(&o.Concurrency, "concurrency", 0, "closed loop: clients, each sending when its last request ends")
	f.DurationVar(&o.Duration, "duration", 30*time.Second, "how long to send (a sweep: each point; a trace: all of it unless set)")
	f.IntVar(&o.Requests, "requests", 0, "how many requests to send at most (0: as many as the duration takes)")
	f.StringVar(&fl.input, "input-tokens", "128", "prompt length distribution (after the shared prefix, if any)")
	f.StringVar(&fl.output, "output-tokens", "128", "answer length distribution")
	f.IntVar(&o.PrefixTokens, "prefix-tokens", 0, "start every prompt with a shared prefix of about this many tokens (0: none)")
	f.IntVar(&o.PrefixGroups, "prefix-groups", 1, "how many distinct shared prefixes, one chosen at random per request")
	f.StringVar(&fl.trace, "trace", "", `replay a JSONL trace: {"time": S, "model": "…", "input_tokens": N, "output_tokens": M} a line`)
	f.Float64Var(&o.TraceSpeed, "trace-speed", 1, "replay the trace this many times faster")
	f.StringVar(&fl.sweep, "sweep", "", "run a load per value: rate=1,2,4,8 or concurrency=1,4,16,64")
	f.DurationVar(&fl.pause, "sweep-pause", 2*time.Second, "rest between two sweep points")
	f.StringVar(&fl.out, "out", "", "folder for sweep.json, sweep.png and sweep.html (default: ./sweep-YYYYMMDD-HHMMSS)")
	f.StringVar(&fl.slo, "slo", "ttft=800ms,tpot=40ms", "goodput bounds: ttft=, tpot=, e2el= (comma-separated)")
	f.Uint64Var(&o.Seed, "seed", 0, "seed of arrivals, lengths, models and prefixes (0: random)")
	f.BoolVar(&fl.asJSON, "json", false, "print the report (or the sweep) as JSON")
	return cmd
}

// options checks the flags and fills in fl.o; it returns the SLO.
func (fl *benchLoadFlags) options(f *pflag.FlagSet) (load.SLO, error) {
	o := &fl.o
	var err error
	if o.Input, err = load.ParseDist(fl.input); err != nil {
		return load.SLO{}, fmt.Errorf("--input-tokens: %w", err)
	}
	if o.Output, err = load.ParseDist(fl.output); err != nil {
		return load.SLO{}, fmt.Errorf("--output-tokens: %w", err)
	}
	bounds, err := parseSLO(fl.slo)
	if err != nil {
		return bounds, err
	}
	if fl.models != "" {
		if o.Models, err = load.ParseMix(fl.models); err != nil {
			return bounds, fmt.Errorf("--model: %w", err)
		}
	}
	if o.PrefixTokens < 0 {
		return bounds, errors.New("--prefix-tokens: want a length ≥ 0")
	}
	if o.PrefixGroups < 1 {
		return bounds, errors.New("--prefix-groups: want at least 1")
	}
	if o.PrefixTokens == 0 {
		o.PrefixGroups = 0
	}
	if o.Burstiness <= 0 {
		return bounds, errors.New("--burstiness: want a shape > 0")
	}
	if o.APIKey = fl.key; o.APIKey == "" {
		o.APIKey = os.Getenv("OPENAI_API_KEY")
	}
	switch {
	case fl.trace != "":
		if err := fl.traceOptions(f); err != nil {
			return bounds, err
		}
	case fl.sweep != "":
		param, _, err := load.ParseSweep(fl.sweep)
		if err != nil {
			return bounds, fmt.Errorf("--sweep: %w", err)
		}
		if f.Changed("rate") || f.Changed("concurrency") {
			return bounds, fmt.Errorf("--sweep %s=… sets each point's load: leave out --rate and --concurrency", param)
		}
	case o.Rate <= 0 && o.Concurrency <= 0:
		return bounds, errors.New("give --rate, --concurrency, --trace or --sweep")
	}
	if len(o.Models.Names) == 0 {
		return bounds, errors.New("--model: name the model requests go to")
	}
	return bounds, nil
}

// traceOptions reads --trace into fl.o.
func (fl *benchLoadFlags) traceOptions(f *pflag.FlagSet) error {
	o := &fl.o
	for _, other := range []string{"rate", "concurrency", "sweep", "burstiness"} {
		if f.Changed(other) {
			return fmt.Errorf("--trace sets the arrivals: leave out --%s", other)
		}
	}
	if o.TraceSpeed <= 0 {
		return errors.New("--trace-speed: want a factor > 0")
	}
	if f.Changed("input-tokens") || f.Changed("output-tokens") {
		return errors.New("--trace sets the lengths: leave out --input-tokens and --output-tokens")
	}
	var err error
	if o.Trace, err = load.ReadTrace(fl.trace); err != nil {
		return err
	}
	if !f.Changed("duration") {
		o.Duration = 0 // the whole trace
	}
	if len(o.Models.Names) > 0 {
		return nil
	}
	var named []string // the trace's models stand for the mix in the report
	for _, e := range o.Trace {
		if e.Model == "" {
			return fmt.Errorf("trace %s line %d names no model: give --model", fl.trace, e.Line)
		}
		if !slices.Contains(named, e.Model) {
			named = append(named, e.Model)
		}
	}
	o.Models = load.Mix{Names: named}
	return nil
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

// progress shows, on w while the load runs (not with --json, and not
// when w is no terminal), a bar of the requests answered with a live line
// (in flight, req/s, TTFT so far), and returns its stop.
func progress(w io.Writer, o *load.Options, quiet bool) func() {
	if quiet || !cupwriter.New(w, false).IsTerminal() {
		return func() {}
	}
	p := mpb.New(mpb.WithOutput(w))
	done := addLiveBar(p, o, "requests ")
	return func() {
		done()
		p.Wait()
	}
}

// addLiveBar adds to p a bar of o's requests (hooked to o) and returns
// what completes it.
func addLiveBar(p *mpb.Progress, o *load.Options, name string) func() {
	total := int64(o.Requests)
	switch {
	case o.Trace != nil && (total == 0 || int(total) > len(o.Trace)):
		total = int64(len(o.Trace))
	case total == 0:
		total = int64(o.Duration.Seconds() * max(o.Rate, 1))
	}
	tally := load.NewTally(time.Now())
	var mu sync.Mutex
	var line string
	var at time.Time
	live := decor.Any(func(decor.Statistics) string {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); now.Sub(at) >= time.Second || line == "" {
			s := tally.Snapshot(now)
			at, line = now, fmt.Sprintf(" in flight %d · %.1f req/s · TTFT p50 %.0f ms p99 %.0f ms · failed %d · ",
				s.InFlight, s.RequestRate, s.TTFTP50, s.TTFTP99, s.Failed)
		}
		return line
	})
	bar := p.AddBar(total, mpb.PrependDecorators(decor.Name(name), decor.CountersNoUnit("%d / %d")),
		mpb.AppendDecorators(live, decor.Elapsed(decor.ET_STYLE_GO)))
	prevSend, prevResult := o.OnSend, o.OnResult
	o.OnSend = func() {
		tally.Sent()
		if prevSend != nil {
			prevSend()
		}
	}
	o.OnResult = func(r load.Result) {
		tally.Done(r)
		bar.Increment()
		if prevResult != nil {
			prevResult(r)
		}
	}
	return func() {
		mu.Lock()
		at = time.Time{} // the last frame shows the final figures
		mu.Unlock()
		bar.SetTotal(-1, true)
	}
}

// writeLoadReport prints a report as vllm bench serve lays its out, then
// its breakdown by model when it names several.
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
	if len(r.Models) < 2 {
		return
	}
	names := make([]string, 0, len(r.Models))
	for m := range r.Models {
		names = append(names, m)
	}
	sort.Strings(names)
	width := 5
	for _, m := range names {
		width = max(width, len(m))
	}
	fmt.Fprintln(w, center("By model"))
	fmt.Fprintf(w, "%-*s %6s %6s %8s %10s %9s %9s %9s %8s %8s\n", width, "model", "ok", "failed", "req/s", "out tok/s",
		"TTFT p50", "TTFT p99", "TPOT p50", "SLO met", "goodput")
	for _, m := range names {
		s := r.Models[m]
		fmt.Fprintf(w, "%-*s %6d %6d %8.2f %10.1f %9.1f %9.1f %9.2f %7.1f%% %8.2f\n", width, m, s.Completed, s.Failed,
			s.RequestThroughput, s.OutputThroughput, s.TTFT.Median, s.TTFT.P99, s.TPOT.Median, 100*s.SLOAttainment, s.RequestGoodput)
	}
	fmt.Fprintln(w, "(latencies in ms)")
}

// center frames a section title as vLLM's report does.
func center(title string) string {
	const width = 50
	pad := max(0, width-len(title)-2)
	return strings.Repeat("-", pad/2) + " " + title + " " + strings.Repeat("-", pad-pad/2)
}
