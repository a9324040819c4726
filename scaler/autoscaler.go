package scaler

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
)

// Names of the signals in Decision.PerSignal and Decision.Signal, and the
// values of the metrics' signal label. The first four are the demand
// signals; the rest name the rule that set the final count.
const (
	SignalConcurrency    = "concurrency"
	SignalQueue          = "queue"
	SignalKV             = "kv"
	SignalQueueWait      = "queue_wait"
	SignalPredictive     = "predictive"
	SignalIdle           = "idle"
	SignalPanicHold      = "panic_hold"
	SignalScaleDownDelay = "scale_down_delay"
	SignalMin            = "min"
	SignalMax            = "max"
)

// maxCount caps any computed replica count so float overflow cannot wrap.
const maxCount = 1 << 30

// Signals are the engine-side observations of one deployment at decision
// time, gathered by the caller from the replicas' vLLM-style metrics.
type Signals struct {
	// Ready is the number of replicas currently serving.
	Ready int
	// Waiting is the sum of vllm:num_requests_waiting over ready replicas.
	Waiting int
	// KVUsage is vllm:kv_cache_usage_perc (0..1) across ready replicas; the
	// caller picks max or mean.
	KVUsage float64
	// QueueWaitP90 is the p90 of how long requests recently waited in the
	// activator's buffer for a replica (the router's samples of the last
	// stable window); 0 means none waited or there were no samples.
	QueueWaitP90 time.Duration
	// AvgLatency is the recent mean request duration, used by the predictive
	// floor; 0 falls back to Config.AvgLatency.
	AvgLatency time.Duration
}

// Decision is one answer of Decide: how many replicas the deployment should
// have, and why.
type Decision struct {
	// Desired is the replica count to converge to.
	Desired int
	// Panic reports whether the autoscaler is in panic mode.
	Panic bool
	// Signal names the rule that set Desired (one of the Signal* constants).
	Signal string
	// Reason says in words which signal won and with what numbers, e.g.
	// "concurrency: stable avg 23.1 / target 8 → 3".
	Reason string
	// PerSignal is each demand signal's own count (concurrency, queue, kv,
	// queue_wait); a signal that is not firing reads 0.
	PerSignal map[string]int
	// PredictiveFloor is the forecaster's floor (0 when off or no data).
	PredictiveFloor int
	// StableConcurrency and PanicConcurrency are the window averages of
	// in-flight requests the concurrency signal was computed from.
	StableConcurrency, PanicConcurrency float64
}

// Autoscaler decides the replica count of one deployment. All methods take
// the current time from the caller and are safe for concurrent use. Times
// that go backwards are treated as the latest time seen.
type Autoscaler struct {
	cfg Config

	mu          sync.Mutex
	now         int64 // latest time seen, Unix nanoseconds
	conc        *window
	arrivals    *forecaster
	hold        maxHold
	poked       bool
	busySeen    bool  // lastBusy is set
	lastBusy    int64 // latest time with requests in flight, buffered or arriving
	arrivalSeen bool  // lastArrival is set
	lastArrival int64 // latest time a request arrived
	panicking   bool
	panicSince  int64
	panicLast   int64
	lastDesired int
}

// NewAutoscaler returns an Autoscaler for cfg, with zero fields set to their
// defaults, or an error naming the field that cannot work.
func NewAutoscaler(cfg Config) (*Autoscaler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Autoscaler{
		cfg:      cfg,
		conc:     newWindow(int64(cfg.Granularity), int64(cfg.StableWindow)),
		arrivals: newForecaster(cfg.Seasonality),
		hold:     maxHold{delay: max(int64(cfg.ScaleDownDelay), 0)},
	}, nil
}

// Config returns the effective configuration, defaults filled in.
func (a *Autoscaler) Config() Config { return a.cfg }

// tick turns now into Unix nanoseconds that never go backwards. Callers hold mu.
func (a *Autoscaler) tick(now time.Time) int64 {
	t := now.UnixNano()
	if t < a.now {
		return a.now
	}
	a.now = t
	return t
}

// Record samples the deployment's in-flight plus buffered requests at now.
// The value holds until the next sample, so the caller may record on every
// change or on a fixed tick. Negative values count as zero; NaN and
// infinities are ignored.
func (a *Autoscaler) Record(now time.Time, concurrency float64) {
	if math.IsNaN(concurrency) || math.IsInf(concurrency, 0) {
		return
	}
	concurrency = max(concurrency, 0)
	a.mu.Lock()
	t := a.tick(now)
	if a.conc.value > 0 || concurrency > 0 { // the previous value held until t
		a.markBusy(t)
	}
	a.conc.set(t, concurrency)
	a.mu.Unlock()
}

// markBusy notes that the deployment had demand at t. Callers hold mu.
func (a *Autoscaler) markBusy(t int64) {
	a.busySeen, a.lastBusy = true, t
}

// SetColdStart updates how far ahead the predictive floor looks: the
// deployment's latest measured cold start.
func (a *Autoscaler) SetColdStart(d time.Duration) {
	a.mu.Lock()
	a.cfg.ColdStart = max(d, 0)
	a.mu.Unlock()
}

// RecordArrival counts one request arrival at now for the forecaster.
func (a *Autoscaler) RecordArrival(now time.Time) { a.RecordArrivals(now, 1) }

// RecordArrivals counts n request arrivals at now for the forecaster, for
// callers that batch their counting. n <= 0 only advances the clock.
func (a *Autoscaler) RecordArrivals(now time.Time, n int) {
	a.mu.Lock()
	t := a.tick(now)
	if n > 0 {
		a.markBusy(t)
		a.arrivalSeen, a.lastArrival = true, t
	}
	a.arrivals.add(t, float64(max(n, 0)))
	a.mu.Unlock()
}

// Poke tells the autoscaler a request is waiting right now, so the next
// Decide asks for at least one replica even if no concurrency sample has
// accumulated any time yet. The activator calls it when it buffers a request
// for a deployment without a ready replica.
func (a *Autoscaler) Poke(now time.Time) {
	a.mu.Lock()
	a.markBusy(a.tick(now))
	a.poked = true
	a.mu.Unlock()
}

// ceilCount is ceil(x) as a replica count, tolerant of float noise (16.0000001
// replicas' worth is 16) and capped so it cannot overflow.
func ceilCount(x float64) int {
	if !(x > 0) {
		return 0
	}
	if x >= maxCount {
		return maxCount
	}
	return int(math.Ceil(x - 1e-9))
}

type candidate struct {
	signal string
	n      int
	reason string
}

// Decide returns the replica count the deployment should have at now, given
// the engines' current signals. It updates panic mode, the scale-down hold
// and the previous decision, so call it at the cadence decisions are acted
// on (e.g. every 2 s).
//
// The demand signals are concurrency (the window averages of in-flight plus
// buffered requests over the target), queue (engine-queued requests beyond
// what the ready replicas absorb), kv (cache usage above KVUsageHigh) and
// queue_wait (the p90 time requests waited in the activator's buffer above
// TTFTSLO). The last three ask for more replicas than are ready, so they
// count only while the deployment has requests in flight or buffered. A
// deployment with nothing in flight, buffered or arriving for a whole
// StableWindow is idle: it recommends zero whatever its past signals (panic
// mode ends), so it reaches MinReplicas after StableWindow + ScaleDownDelay.
func (a *Autoscaler) Decide(now time.Time, s Signals) Decision {
	a.mu.Lock()
	defer a.mu.Unlock()
	cfg := a.cfg
	t := a.tick(now)
	a.conc.advance(t)
	a.arrivals.advance(t)

	busy := a.conc.value > 0 || a.poked // demand right now
	a.poked = false
	if busy {
		a.markBusy(t)
	}
	idle := !a.busySeen || t-a.lastBusy >= int64(cfg.StableWindow)

	ready := max(s.Ready, 0)
	target := cfg.TargetConcurrency
	stableAvg := a.conc.average(t, int64(cfg.StableWindow))
	panicAvg := a.conc.average(t, int64(cfg.PanicWindow))
	stableN, panicN := ceilCount(stableAvg/target), ceilCount(panicAvg/target)

	switch {
	case idle:
		a.panicking = false
	case panicN > 0 && float64(panicN) >= cfg.PanicThreshold*float64(max(ready, 1)):
		if !a.panicking {
			a.panicking, a.panicSince = true, t
		}
		a.panicLast = t
	case a.panicking && t-a.panicLast >= int64(cfg.StableWindow):
		a.panicking = false
	}

	conc := candidate{SignalConcurrency, stableN,
		fmt.Sprintf("concurrency: stable avg %.1f / target %s → %d", stableAvg, num(target), stableN)}
	if a.panicking {
		conc = candidate{SignalConcurrency, panicN,
			fmt.Sprintf("concurrency: panic avg %.1f / target %s → %d", panicAvg, num(target), panicN)}
	}
	if busy && conc.n == 0 {
		conc = candidate{SignalConcurrency, 1,
			fmt.Sprintf("concurrency: %s in flight now with %d ready → 1", num(max(a.conc.value, 1)), ready)}
	}

	cands := []candidate{conc, {SignalQueue, 0, ""}, {SignalKV, 0, ""}, {SignalQueueWait, 0, ""}}
	if absorbed := cfg.MaxWaitingPerReplica * ready; busy && s.Waiting > absorbed {
		add := ceilCount(float64(s.Waiting-absorbed) / float64(cfg.MaxWaitingPerReplica))
		cands[1].n = ready + add
		cands[1].reason = fmt.Sprintf("queue: %d waiting > %d per replica × %d ready → ready %d + %d = %d",
			s.Waiting, cfg.MaxWaitingPerReplica, ready, ready, add, cands[1].n)
	}
	if busy && s.KVUsage > cfg.KVUsageHigh {
		cands[2].n = ready + 1
		cands[2].reason = fmt.Sprintf("kv: usage %.2f > %.2f → ready %d + 1 = %d", s.KVUsage, cfg.KVUsageHigh, ready, cands[2].n)
	}
	if busy && s.QueueWaitP90 > cfg.TTFTSLO {
		cands[3].n = ready + 1
		cands[3].reason = fmt.Sprintf("queue_wait: p90 %v > SLO %v → ready %d + 1 = %d",
			round(s.QueueWaitP90), round(cfg.TTFTSLO), ready, cands[3].n)
	}
	d := Decision{
		Panic:             a.panicking,
		PerSignal:         make(map[string]int, len(cands)),
		StableConcurrency: stableAvg,
		PanicConcurrency:  panicAvg,
	}
	win := cands[0]
	for _, c := range cands {
		if idle {
			c.n = 0
		}
		d.PerSignal[c.signal] = c.n
		if c.n > win.n {
			win = c
		}
	}
	if idle {
		reason := "idle: no request seen → 0"
		if a.busySeen {
			reason = fmt.Sprintf("idle: nothing in flight, buffered or arriving for %v → 0", round(time.Duration(t-a.lastBusy)))
		}
		win = candidate{SignalIdle, 0, reason}
	}

	if floor, reason := a.predictiveFloor(t, s.AvgLatency); floor > 0 {
		d.PredictiveFloor = floor
		if floor > win.n {
			win = candidate{SignalPredictive, floor, reason}
		}
	}

	if a.panicking {
		if keep := max(ready, a.lastDesired); keep > win.n {
			win = candidate{SignalPanicHold, keep, fmt.Sprintf(
				"panic_hold: panicking for %v, keeping max(ready %d, previous %d) = %d (recommended %d by %s)",
				round(time.Duration(t-a.panicSince)), ready, a.lastDesired, keep, win.n, win.reason)}
		}
	}

	if held := a.hold.push(t, win.n); held > win.n {
		since := time.Duration(t - a.hold.front().at)
		win = candidate{SignalScaleDownDelay, held, fmt.Sprintf(
			"scale_down_delay: holding %d recommended %v ago for %v (recommended %d by %s)",
			held, round(since), round(cfg.ScaleDownDelay), win.n, win.reason)}
	}

	if win.n < cfg.MinReplicas {
		win = candidate{SignalMin, cfg.MinReplicas, fmt.Sprintf(
			"min: raised to MinReplicas %d (recommended %d by %s)", cfg.MinReplicas, win.n, win.reason)}
	}
	if cfg.MaxReplicas > 0 && win.n > cfg.MaxReplicas {
		win = candidate{SignalMax, cfg.MaxReplicas, fmt.Sprintf(
			"max: capped at MaxReplicas %d (recommended %d by %s)", cfg.MaxReplicas, win.n, win.reason)}
	}

	d.Desired, d.Signal, d.Reason = win.n, win.signal, win.reason
	a.lastDesired = win.n
	return d
}

// predictiveFloor applies Little's law to the forecast arrival rate one cold
// start ahead: floor = ceil(rate(now+ColdStart) × latency / target), or 0
// when less than one request is expected within a cold start (or a
// request's latency, whichever is longer). After a StableWindow without
// arrivals the forecast's level and trend (smoothed recent traffic, which
// has been none) no longer count: only a seasonal rise expected at the
// horizon keeps a floor, so an idle deployment's floor falls to zero
// before a full season has been seen. Callers hold mu.
func (a *Autoscaler) predictiveFloor(t int64, latency time.Duration) (int, string) {
	if latency <= 0 {
		latency = a.cfg.AvgLatency
	}
	if latency <= 0 || a.cfg.NoPrediction {
		return 0, ""
	}
	at := t + int64(a.cfg.ColdStart+a.cfg.Lead)
	rate, ok := a.arrivals.rate(at)
	if !ok {
		return 0, ""
	}
	what := "forecast"
	if !a.arrivalSeen || t-a.lastArrival >= int64(a.cfg.StableWindow) {
		rate, what = min(rate, a.arrivals.seasonalRise(at)), "seasonal rise (no arrivals for a window)"
	}
	// Fewer than one arrival expected during a cold start: reacting costs
	// at most that request's wait, so the floor lets the deployment go
	// to zero.
	if rate*max(a.cfg.ColdStart, latency).Seconds() < 1 {
		return 0, ""
	}
	n := ceilCount(rate * latency.Seconds() / a.cfg.TargetConcurrency)
	return n, fmt.Sprintf("predictive: %s %.2f req/s at +%v × latency %v / target %s → %d",
		what, rate, round(a.cfg.ColdStart+a.cfg.Lead), round(latency), num(a.cfg.TargetConcurrency), n)
}

// round rounds a duration for a Reason: to whole seconds from 10 s, to
// 100 ms from 1 s, to milliseconds from 1 ms and to microseconds below.
func round(d time.Duration) time.Duration {
	switch a := d.Abs(); {
	case a >= 10*time.Second:
		return d.Round(time.Second)
	case a >= time.Second:
		return d.Round(100 * time.Millisecond)
	case a >= time.Millisecond:
		return d.Round(time.Millisecond)
	default:
		return d.Round(time.Microsecond)
	}
}

// num formats a float for a Reason with at most two decimals, without
// trailing zeros (8, 8.5, 8.33).
func num(x float64) string {
	return strconv.FormatFloat(math.Round(x*100)/100, 'f', -1, 64)
}
