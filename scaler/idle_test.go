package scaler

import (
	"cmp"
	"regexp"
	"strings"
	"testing"
	"time"
)

// specConfig is the Config reconcile.NewAutoscaler builds from a
// deployment spec with the given window, idle delay (0: none) and bounds,
// and the spec's other defaults.
func specConfig(window, idleDelay time.Duration, lo, hi int) Config {
	delay := idleDelay
	if delay == 0 {
		delay = -1
	}
	return Config{TargetConcurrency: 8, MinReplicas: lo, MaxReplicas: hi, TTFTSLO: 800 * time.Millisecond,
		ScaleDownDelay: delay, StableWindow: window, PanicWindow: max(window/10, time.Second),
		Granularity: min(time.Second, window/10)}
}

// loop drives an Autoscaler the way the reconcile loop does: on each 1 s
// tick it records the router's concurrency and new arrivals, then decides
// with the engines' signals.
type loop struct {
	t   *testing.T
	a   *Autoscaler
	now time.Time
}

func newLoop(t *testing.T, cfg Config) *loop {
	t.Helper()
	a, err := NewAutoscaler(cfg)
	if err != nil {
		t.Fatalf("NewAutoscaler: %v", err)
	}
	return &loop{t: t, a: a, now: epoch}
}

// tick reconciles once at the current time, then moves the clock 1 s on.
func (l *loop) tick(concurrency float64, arrivals int, s Signals) Decision {
	l.a.Record(l.now, concurrency)
	l.a.RecordArrivals(l.now, arrivals)
	d := l.a.Decide(l.now, s)
	l.now = l.now.Add(time.Second)
	return d
}

// TestOneColdRequestStartsOneReplica drives the autoscaler through a cold
// start as the reconcile loop sees it: the request is buffered (a poke),
// the replica takes a few seconds to become ready, then the engine reports
// the request being admitted as waiting. Exactly one replica is wanted
// throughout.
func TestOneColdRequestStartsOneReplica(t *testing.T) {
	for _, tc := range []struct {
		name     string
		requests int           // arriving together, all buffered
		waiting  int           // what the engine reports as they are admitted
		latency  time.Duration // the router's mean latency
	}{
		{"one request", 1, 1, 0},
		{"one request to a slow model", 1, 1, 20 * time.Second},
		{"four requests, all queued in the engine", 4, 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLoop(t, specConfig(time.Minute, 30*time.Second, 0, 4))
			check := func(phase string, d Decision) {
				t.Helper()
				if d.Desired != 1 {
					t.Fatalf("%s: desired %d by %s (%s), want 1", phase, d.Desired, d.Signal, d.Reason)
				}
			}
			n := float64(tc.requests)
			l.a.Poke(l.now) // the activator buffered the request(s)
			check("first decision", l.tick(n, tc.requests, Signals{AvgLatency: tc.latency}))
			for range 5 { // cold start
				check("cold start", l.tick(n, 0, Signals{AvgLatency: tc.latency}))
			}
			for range 3 { // the replica is ready; the engine admits them
				check("admitting", l.tick(n, 0, Signals{Ready: 1, Waiting: tc.waiting, AvgLatency: tc.latency}))
			}
			for range 20 { // running
				check("running", l.tick(n, 0, Signals{Ready: 1, AvgLatency: tc.latency}))
			}
		})
	}
}

// TestIdleGoesToMin scales a deployment up with slow, queueing requests,
// then stops all traffic while the signals it was scaled up by keep their
// last values: it reaches MinReplicas exactly StableWindow +
// ScaleDownDelay after the last request ended, never rises meanwhile, and
// (when MinReplicas is 0) is not at zero before then.
func TestIdleGoesToMin(t *testing.T) {
	slow := Signals{Waiting: 9, KVUsage: 0.95, QueueWaitP90: 2200 * time.Millisecond, AvgLatency: 20 * time.Second}
	for _, tc := range []struct {
		name        string
		cfg         Config
		load        float64       // in flight while busy
		busy        int           // seconds of traffic; 0 means two minutes
		pinned      int           // ready replicas whatever the decision (no runtime slot); 0 follows it
		offset      time.Duration // ticks this far off whole seconds
		idleAfter   time.Duration
		latencyless bool // no mean latency: the predictive floor is off
	}{
		{name: "min 0", cfg: specConfig(time.Minute, 30*time.Second, 0, 4), load: 2, idleAfter: 90 * time.Second},
		{name: "min 1", cfg: specConfig(time.Minute, 30*time.Second, 1, 4), load: 2, idleAfter: 90 * time.Second},
		{name: "no idle delay", cfg: specConfig(time.Minute, 0, 0, 4), load: 2, idleAfter: time.Minute},
		{name: "short window", cfg: specConfig(10*time.Second, 5*time.Second, 0, 4), load: 2, idleAfter: 15 * time.Second},
		{name: "no forecast", cfg: specConfig(time.Minute, 30*time.Second, 0, 4), load: 2, idleAfter: 90 * time.Second, latencyless: true},
		// Stopped before reaching MaxReplicas: the engines' last readings
		// must not keep adding replicas.
		{name: "short burst", cfg: specConfig(time.Minute, 30*time.Second, 0, 8), load: 2, busy: 3, idleAfter: 90 * time.Second},
		{name: "ticks off the second", cfg: specConfig(time.Minute, 30*time.Second, 0, 4), load: 2, offset: 300 * time.Millisecond, idleAfter: 90 * time.Second},
		// No runtime slot for more replicas: one stays ready, and the
		// autoscaler is still panicking when traffic stops.
		{name: "panicking when traffic stops", cfg: specConfig(time.Minute, 30*time.Second, 0, 8), load: 40, pinned: 1, idleAfter: 90 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLoop(t, tc.cfg)
			l.now = l.now.Add(tc.offset)
			sig := slow
			if tc.latencyless {
				sig.AvgLatency = 0
			}
			ready := 0
			var d Decision
			for range cmp.Or(tc.busy, 120) { // busy: a request a second
				s := sig
				s.Ready = cmp.Or(tc.pinned, ready)
				d = l.tick(tc.load, 1, s)
				ready = d.Desired
			}
			if d.Desired < 2 {
				t.Fatalf("busy: desired %d (%s), want a scale-up", d.Desired, d.Reason)
			}
			stop := l.now // the first tick with nothing in flight
			peak := d.Desired
			lo := tc.cfg.MinReplicas
			for l.now.Before(stop.Add(tc.idleAfter + 5*time.Second)) {
				at := l.now.Sub(stop)
				s := sig
				s.Ready = cmp.Or(tc.pinned, ready)
				d = l.tick(0, 0, s)
				ready = d.Desired
				switch {
				case d.Desired > peak:
					t.Fatalf("%v idle: desired rose to %d (%s)", at, d.Desired, d.Reason)
				case at < tc.idleAfter && lo == 0 && d.Desired == 0:
					t.Fatalf("%v idle: at zero before %v (%s)", at, tc.idleAfter, d.Reason)
				case at >= tc.idleAfter && d.Desired != lo:
					t.Fatalf("%v idle: desired %d by %s (%s), want MinReplicas %d", at, d.Desired, d.Signal, d.Reason, lo)
				case at >= tc.idleAfter && d.Panic:
					t.Fatalf("%v idle: still panicking", at)
				}
				peak = d.Desired
			}
		})
	}
}

// TestDemandSignalsNeedRequestsNow checks that the signals asking for more
// replicas than are ready stay silent when nothing is in flight or
// buffered, however the engines' last readings look.
func TestDemandSignalsNeedRequestsNow(t *testing.T) {
	hot := Signals{Ready: 2, Waiting: 20, KVUsage: 0.99, QueueWaitP90: 5 * time.Second}
	for _, tc := range []struct {
		name string
		now  float64 // in flight now
		want map[string]int
	}{
		{"requests in flight", 1, map[string]int{SignalQueue: 5, SignalKV: 3, SignalQueueWait: 3}},
		{"nothing in flight", 0, map[string]int{SignalQueue: 0, SignalKV: 0, SignalQueueWait: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAutoscaler(Config{})
			if err != nil {
				t.Fatal(err)
			}
			a.Record(epoch, 16)
			a.Record(epoch.Add(time.Minute), tc.now)
			d := a.Decide(epoch.Add(time.Minute+time.Second), hot)
			for sig, want := range tc.want {
				if d.PerSignal[sig] != want {
					t.Errorf("PerSignal[%s] = %d, want %d (%s)", sig, d.PerSignal[sig], want, d.Reason)
				}
			}
		})
	}
}

// TestReasonsRounded checks that every reason prints durations rounded
// (whole seconds from 10 s, 100 ms from 1 s, milliseconds below) and
// floats with at most two decimals.
func TestReasonsRounded(t *testing.T) {
	jitter := 759071 * time.Nanosecond
	for _, tc := range []struct {
		name   string
		cfg    Config
		decide func(a *Autoscaler) Decision
		want   string // a part of the reason
	}{
		{"queue_wait", Config{TTFTSLO: 812345678 * time.Nanosecond}, func(a *Autoscaler) Decision {
			a.Record(epoch, 16)
			return a.Decide(epoch.Add(2*time.Minute), Signals{Ready: 2, QueueWaitP90: 2234567891 * time.Nanosecond})
		}, "queue_wait: p90 2.2s > SLO 812ms → ready 2 + 1 = 3"},
		{"target", Config{TargetConcurrency: 25.0 / 3}, func(a *Autoscaler) Decision {
			a.Record(epoch, 23.1)
			return a.Decide(epoch.Add(2*time.Minute), Signals{Ready: 3})
		}, "concurrency: stable avg 23.1 / target 8.33 → 3"},
		{"in flight now", Config{}, func(a *Autoscaler) Decision {
			a.Record(epoch, 7.0/3)
			return a.Decide(epoch, Signals{})
		}, "concurrency: 2.33 in flight now with 0 ready → 1"},
		{"scale_down_delay", Config{StableWindow: 10 * time.Second, PanicWindow: 2 * time.Second, ScaleDownDelay: 30*time.Second + 123456789}, func(a *Autoscaler) Decision {
			a.Record(epoch, 24)
			a.Decide(epoch.Add(20*time.Second), Signals{Ready: 3})
			a.Record(epoch.Add(20*time.Second), 8)
			return a.Decide(epoch.Add(26*time.Second+jitter), Signals{Ready: 3})
		}, "scale_down_delay: holding 3 recommended 6s ago for 30s"},
		{"panic_hold", Config{}, func(a *Autoscaler) Decision {
			a.Record(epoch, 40)
			a.Decide(epoch.Add(time.Second+jitter), Signals{Ready: 1})
			a.Record(epoch.Add(time.Second+jitter), 0)
			return a.Decide(epoch.Add(4500*time.Millisecond), Signals{Ready: 1})
		}, "panic_hold: panicking for 3.5s,"},
		{"predictive", Config{ColdStart: 5432100 * time.Microsecond, AvgLatency: 1234567890, Seasonality: shortDay}, func(a *Autoscaler) Decision {
			for sec := range 120 {
				a.RecordArrivals(epoch.Add(time.Duration(sec)*time.Second+jitter), 500)
			}
			return a.Decide(epoch.Add(2*time.Minute+jitter), Signals{})
		}, "at +5.4s × latency 1.2s / target 8 →"},
		{"idle", Config{ScaleDownDelay: -1}, func(a *Autoscaler) Decision {
			a.Record(epoch, 4)
			a.Record(epoch.Add(time.Second), 0)
			return a.Decide(epoch.Add(61*time.Second+400*time.Millisecond+jitter), Signals{Ready: 1})
		}, "idle: nothing in flight, buffered or arriving for 1m0s → 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAutoscaler(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			d := tc.decide(a)
			if !strings.Contains(d.Reason, tc.want) {
				t.Errorf("Reason %q does not contain %q", d.Reason, tc.want)
			}
			if long := regexp.MustCompile(`\d\.\d{3,}`).FindString(d.Reason); long != "" {
				t.Errorf("Reason %q prints %s unrounded", d.Reason, long)
			}
		})
	}
}
