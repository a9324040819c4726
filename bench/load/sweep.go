package load

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What a sweep varies: the open loop's rate or the closed loop's
// concurrency.
const (
	SweepRate        = "rate"
	SweepConcurrency = "concurrency"
)

// SweepVersion is the version of the sweep.json schema this package
// writes; ReadSweep refuses a newer one.
const SweepVersion = 1

// The defaults of a sweep's two findings.
const (
	// DefaultKneeFactor bounds the p99 TTFT of a point within the knee,
	// as a multiple of the lowest-load point's.
	DefaultKneeFactor = 1.5
	// DefaultSLOTarget is the fraction of requests that must meet the SLO
	// at the max-SLO point.
	DefaultSLOTarget = 0.9
)

// Sweep is a series of loads, one a point, of increasing rate or
// concurrency against one target, with where latency turns up (the knee)
// and the highest load that still meets the SLO. It is what sweep.json
// holds; `stoke plan --sweep` reads it with ReadSweep.
type Sweep struct {
	// Version is the schema's (SweepVersion).
	Version int `json:"version"`
	// Created is when the sweep started; Command the command line that
	// ran it, when known.
	Created time.Time `json:"created"`
	Command string    `json:"command,omitempty"`
	// URL is the target's base URL; Models the models the requests named
	// with their shares of the requests.
	URL    string       `json:"url"`
	Models []SweepModel `json:"models"`
	// Param is what the points vary: "rate" (requests a second, open
	// loop) or "concurrency" (clients, closed loop). Burstiness is the
	// open loop's gamma shape (1: Poisson).
	Param      string  `json:"param"`
	Burstiness float64 `json:"burstiness,omitempty"`
	// DurationSeconds and Requests are each point's bounds (0: none).
	DurationSeconds float64 `json:"duration_s"`
	Requests        int     `json:"requests"`
	// InputTokens and OutputTokens are the length distributions (as
	// ParseDist reads them); InputTokensMean is the mean prompt length,
	// shared prefix included, OutputTokensMean the mean answer length.
	InputTokens      string  `json:"input_tokens"`
	InputTokensMean  float64 `json:"input_tokens_mean"`
	OutputTokens     string  `json:"output_tokens"`
	OutputTokensMean float64 `json:"output_tokens_mean"`
	// PrefixTokens and PrefixGroups describe a shared-prefix mix (0: none).
	PrefixTokens int `json:"prefix_tokens"`
	PrefixGroups int `json:"prefix_groups"`
	// Seed seeded the first point (point i used Seed + i); 0 for random.
	Seed uint64 `json:"seed"`
	// SLO is the goodput bound; SLOTarget the fraction of requests that
	// must meet it at the max-SLO point; KneeFactor the bound on a knee
	// point's p99 TTFT as a multiple of BaselineTTFTP99, the lowest-load
	// point's.
	SLO             SweepSLO `json:"slo"`
	SLOTarget       float64  `json:"slo_target"`
	KneeFactor      float64  `json:"knee_factor"`
	BaselineTTFTP99 float64  `json:"baseline_ttft_p99_ms"`
	// Points are the loads run, in increasing load.
	Points []SweepPoint `json:"points"`
	// Knee is the highest-load point whose p99 TTFT is within KneeFactor
	// of the baseline's (see Knee); MaxSLO the highest-load point at which
	// at least SLOTarget of the requests met the SLO (see MaxSLO). Either
	// is null when no point qualifies.
	Knee   *SweepMark `json:"knee"`
	MaxSLO *SweepMark `json:"max_slo"`
}

// SweepModel is a model of a sweep's mix and its expected share of the
// requests.
type SweepModel struct {
	Name  string  `json:"name"`
	Share float64 `json:"share"`
}

// SweepSLO is an SLO in milliseconds (0: no bound).
type SweepSLO struct {
	TTFT float64 `json:"ttft_ms"`
	TPOT float64 `json:"tpot_ms"`
	E2E  float64 `json:"e2el_ms"`
}

// SweepSLOOf is slo in milliseconds.
func SweepSLOOf(slo SLO) SweepSLO {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return SweepSLO{TTFT: ms(slo.TTFT), TPOT: ms(slo.TPOT), E2E: ms(slo.E2E)}
}

// String is the SLO as --slo reads it ("none" for no bound).
func (s SweepSLO) String() string {
	var parts []string
	for _, b := range []struct {
		name string
		ms   float64
	}{{"ttft", s.TTFT}, {"tpot", s.TPOT}, {"e2el", s.E2E}} {
		if b.ms > 0 {
			parts = append(parts, b.name+"="+time.Duration(b.ms*float64(time.Millisecond)).String())
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// SweepPoint is one load of a sweep: its rate or concurrency, the
// headline figures, and the run's full report.
type SweepPoint struct {
	// Load is the point's rate (requests a second) or concurrency.
	Load float64 `json:"load"`
	// RequestRate is the achieved request throughput (req/s),
	// OutputThroughput the output tokens a second, Goodput the requests a
	// second that met the SLO, SLOAttainment the fraction of the requests
	// sent that met it.
	RequestRate      float64 `json:"request_rate"`
	OutputThroughput float64 `json:"output_throughput"`
	Goodput          float64 `json:"goodput"`
	SLOAttainment    float64 `json:"slo_attainment"`
	// Completed and Failed count the requests.
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// TTFT, TPOT, ITL and E2E are the latencies in milliseconds.
	TTFT Stats `json:"ttft_ms"`
	TPOT Stats `json:"tpot_ms"`
	ITL  Stats `json:"itl_ms"`
	E2E  Stats `json:"e2el_ms"`
	// Report is the point's whole report (with its breakdown by model).
	Report Report `json:"report"`
}

// PointOf is the sweep point of a run at load that reported rep.
func PointOf(load float64, rep Report) SweepPoint {
	return SweepPoint{Load: load, RequestRate: rep.RequestThroughput, OutputThroughput: rep.OutputThroughput,
		Goodput: rep.RequestGoodput, SLOAttainment: rep.SLOAttainment, Completed: rep.Completed, Failed: rep.Failed,
		TTFT: rep.TTFT, TPOT: rep.TPOT, ITL: rep.ITL, E2E: rep.E2E, Report: rep}
}

// SweepMark is a point a sweep singles out (the knee, the max-SLO point).
type SweepMark struct {
	// Index is the point's in Points, Load its load.
	Index int     `json:"index"`
	Load  float64 `json:"load"`
	// RequestRate, Goodput, SLOAttainment and TTFTP99 are the point's.
	RequestRate   float64 `json:"request_rate"`
	Goodput       float64 `json:"goodput"`
	SLOAttainment float64 `json:"slo_attainment"`
	TTFTP99       float64 `json:"ttft_p99_ms"`
}

// markOf is points[i] as a mark (nil for i < 0).
func markOf(points []SweepPoint, i int) *SweepMark {
	if i < 0 {
		return nil
	}
	p := points[i]
	return &SweepMark{Index: i, Load: p.Load, RequestRate: p.RequestRate, Goodput: p.Goodput, SLOAttainment: p.SLOAttainment, TTFTP99: p.TTFT.P99}
}

// byLoad are the indexes of points in increasing load.
func byLoad(points []SweepPoint) []int {
	idx := make([]int, len(points))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(points[a].Load, points[b].Load) })
	return idx
}

// hasP99 reports whether a point's p99 TTFT stands for its requests: it
// completed some, and at most 1% failed (a failed request never had a
// first token, so past 1% of failures the p99 TTFT is unbounded).
func hasP99(p SweepPoint) bool {
	n := p.Completed + p.Failed
	return p.Completed > 0 && float64(p.Failed) <= 0.01*float64(n)
}

// Knee is the index in points of the highest-load point whose p99 TTFT is
// within factor times the baseline's, the baseline being the lowest-load
// point (taken as unloaded: start a sweep at a low load), or -1 when the
// baseline has no p99 TTFT. A point with no p99 TTFT (none completed, or
// more than 1% failed) is never within.
func Knee(points []SweepPoint, factor float64) int {
	order := byLoad(points)
	if len(order) == 0 || !hasP99(points[order[0]]) {
		return -1
	}
	bound := factor * points[order[0]].TTFT.P99
	knee := -1
	for _, i := range order {
		if hasP99(points[i]) && points[i].TTFT.P99 <= bound {
			knee = i
		}
	}
	return knee
}

// MaxSLO is the index in points of the highest-load point at which at
// least target of the requests sent met the SLO, or -1 when none did.
func MaxSLO(points []SweepPoint, target float64) int {
	best := -1
	for _, i := range byLoad(points) {
		if points[i].Completed > 0 && points[i].SLOAttainment >= target {
			best = i
		}
	}
	return best
}

// Analyze sets the sweep's baseline, knee and max-SLO point from its
// points (KneeFactor and SLOTarget default to 1.5 and 0.9).
func (s *Sweep) Analyze() {
	if s.KneeFactor <= 0 {
		s.KneeFactor = DefaultKneeFactor
	}
	if s.SLOTarget <= 0 {
		s.SLOTarget = DefaultSLOTarget
	}
	s.BaselineTTFTP99 = 0
	if order := byLoad(s.Points); len(order) > 0 {
		s.BaselineTTFTP99 = s.Points[order[0]].TTFT.P99
	}
	s.Knee = markOf(s.Points, Knee(s.Points, s.KneeFactor))
	s.MaxSLO = markOf(s.Points, MaxSLO(s.Points, s.SLOTarget))
}

// ParseSweep reads --sweep: rate=1,2,4,8 or concurrency=1,4,16,64. The
// values come back in increasing order.
func ParseSweep(s string) (param string, values []float64, err error) {
	param, list, ok := strings.Cut(strings.TrimSpace(s), "=")
	param = strings.TrimSpace(param)
	if !ok || (param != SweepRate && param != SweepConcurrency) {
		return "", nil, fmt.Errorf("sweep %q: want rate=R1,R2,… or concurrency=C1,C2,…", s)
	}
	for _, v := range strings.Split(list, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
			return "", nil, fmt.Errorf("sweep %q: %q is not a number > 0", s, v)
		}
		if param == SweepConcurrency && (f != math.Trunc(f) || f > 1<<20) {
			return "", nil, fmt.Errorf("sweep %q: a concurrency is a whole number, not %q", s, v)
		}
		if slices.Contains(values, f) {
			return "", nil, fmt.Errorf("sweep %q: %q is there twice", s, v)
		}
		values = append(values, f)
	}
	if len(values) == 0 {
		return "", nil, fmt.Errorf("sweep %q: give at least one value", s)
	}
	slices.Sort(values)
	return param, values, nil
}

// SweepOptions say what sweep to run.
type SweepOptions struct {
	// Load is every point's load, less its rate or concurrency.
	Load Options
	// Param is what the points vary (SweepRate or SweepConcurrency),
	// Values its values.
	Param  string
	Values []float64
	// Pause is the rest between two points.
	Pause time.Duration
	// SLO is goodput's bound; SLOTarget and KneeFactor as in Sweep
	// (defaults 0.9 and 1.5).
	SLO                   SLO
	SLOTarget, KneeFactor float64
	// Command is the command line, for the record.
	Command string
	// Point, when set, is called before point i runs with its options
	// (to hook progress on them); what it returns is called after.
	Point func(i int, o *Options) (after func())
}

// RunSweep runs one load a value, in increasing order, and analyzes them.
// When it stops early (ctx done), it returns the points it has with the
// error.
func RunSweep(ctx context.Context, so SweepOptions) (Sweep, error) {
	if so.Param != SweepRate && so.Param != SweepConcurrency {
		return Sweep{}, fmt.Errorf("sweep: vary %s or %s, not %q", SweepRate, SweepConcurrency, so.Param)
	}
	if len(so.Values) == 0 {
		return Sweep{}, errors.New("sweep: give at least one value")
	}
	if so.Load.Trace != nil {
		return Sweep{}, errors.New("sweep: a trace sets its own times; it does not sweep")
	}
	values := slices.Clone(so.Values)
	slices.Sort(values)
	o := so.Load
	s := Sweep{Version: SweepVersion, Created: time.Now().UTC(), Command: so.Command, URL: o.URL, Param: so.Param,
		DurationSeconds: o.Duration.Seconds(), Requests: o.Requests,
		InputTokens: o.Input.String(), InputTokensMean: o.Input.Mean() + float64(o.PrefixTokens),
		OutputTokens: o.Output.String(), OutputTokensMean: o.Output.Mean(),
		PrefixTokens: o.PrefixTokens, PrefixGroups: o.PrefixGroups, Seed: o.Seed,
		SLO: SweepSLOOf(so.SLO), SLOTarget: so.SLOTarget, KneeFactor: so.KneeFactor, Points: []SweepPoint{}}
	if o.PrefixTokens > 0 && s.PrefixGroups == 0 {
		s.PrefixGroups = 1
	}
	if so.Param == SweepRate {
		s.Burstiness = cmp.Or(o.Burstiness, 1)
	}
	for i, share := range o.Models.Shares() {
		s.Models = append(s.Models, SweepModel{Name: o.Models.Names[i], Share: share})
	}
	var err error
	for i, v := range values {
		if i > 0 && so.Pause > 0 {
			if err = sleep(ctx, so.Pause); err != nil {
				break
			}
		}
		po := so.Load
		po.Rate, po.Concurrency = 0, 0
		if so.Param == SweepRate {
			po.Rate = v
		} else {
			po.Concurrency = int(v)
		}
		if po.Seed != 0 {
			po.Seed += uint64(i)
		}
		after := func() {}
		if so.Point != nil {
			after = so.Point(i, &po)
		}
		results, took, runErr := Run(ctx, po)
		after()
		if runErr != nil {
			err = fmt.Errorf("sweep: %s=%g: %w", so.Param, v, runErr)
			break
		}
		if err = ctx.Err(); err != nil {
			break // the point was cut short; it does not count
		}
		s.Points = append(s.Points, PointOf(v, Summarize(results, took, so.SLO)))
	}
	s.Analyze()
	return s, err
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ReadSweep reads a sweep.json that RunSweep's caller wrote (WriteSweep).
func ReadSweep(path string) (Sweep, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Sweep{}, fmt.Errorf("reading the sweep: %w", err)
	}
	var s Sweep
	if err := json.Unmarshal(data, &s); err != nil {
		return Sweep{}, fmt.Errorf("sweep %s: %w", path, err)
	}
	switch {
	case s.Version < 1 || s.Version > SweepVersion:
		return Sweep{}, fmt.Errorf("sweep %s: schema version %d, this stoke reads 1 to %d", path, s.Version, SweepVersion)
	case s.Param != SweepRate && s.Param != SweepConcurrency:
		return Sweep{}, fmt.Errorf("sweep %s: param %q, want %s or %s", path, s.Param, SweepRate, SweepConcurrency)
	}
	return s, nil
}

// WriteTable prints the sweep for people: a row a point, then the knee
// and the max-SLO point.
func (s Sweep) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%12s %8s %10s %9s %9s %9s %9s %8s %8s %7s\n", s.Param, "req/s", "out tok/s",
		"TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "SLO met", "goodput", "failed")
	for _, p := range s.Points {
		fmt.Fprintf(w, "%12g %8.2f %10.1f %9.1f %9.1f %9.2f %9.2f %7.1f%% %8.2f %7d\n", p.Load, p.RequestRate, p.OutputThroughput,
			p.TTFT.Median, p.TTFT.P99, p.TPOT.Median, p.TPOT.P99, 100*p.SLOAttainment, p.Goodput, p.Failed)
	}
	fmt.Fprintln(w, "(latencies in ms)")
	fmt.Fprintln(w, s.KneeLine())
	fmt.Fprintln(w, s.MaxSLOLine())
}

// KneeLine says where the knee is, in a line.
func (s Sweep) KneeLine() string {
	if s.Knee == nil {
		return "knee: none (the lowest load has no p99 TTFT to compare with: it completed none, or more than 1% failed)"
	}
	return fmt.Sprintf("knee: %s=%g (p99 TTFT %.1f ms, within %g× the %.1f ms at the lowest load; %.2f req/s)",
		s.Param, s.Knee.Load, s.Knee.TTFTP99, s.KneeFactor, s.BaselineTTFTP99, s.Knee.RequestRate)
}

// MaxSLOLine says where the max-SLO point is, in a line.
func (s Sweep) MaxSLOLine() string {
	if s.MaxSLO == nil {
		return fmt.Sprintf("max SLO: none (no point had %g%% of its requests within %s)", 100*s.SLOTarget, s.SLO)
	}
	return fmt.Sprintf("max SLO: %s=%g (%.1f%% of requests within %s, ≥ %g%%; goodput %.2f req/s)",
		s.Param, s.MaxSLO.Load, 100*s.MaxSLO.SLOAttainment, s.SLO, 100*s.SLOTarget, s.MaxSLO.Goodput)
}
