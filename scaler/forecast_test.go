package scaler

import (
	"math"
	"testing"
	"time"
)

// dailyRate is a test "day" of 60 one-second buckets: 1 req/s, with a spike
// of 20 req/s during seconds [40, 45).
func dailyRate(sec int) int {
	if s := sec % 60; s >= 40 && s < 45 {
		return 20
	}
	return 1
}

var shortDay = Seasonality{Period: time.Minute, Bucket: time.Second}

func TestForecasterSeasonal(t *testing.T) {
	f := newForecaster(shortDay.withDefaults())
	start := epoch.UnixNano()
	const days = 4
	for sec := range days * 60 {
		f.add(start+int64(sec)*int64(time.Second), float64(dailyRate(sec)))
	}
	now := start + days*60*int64(time.Second) // the start of day 5
	f.advance(now)
	tests := []struct {
		name string
		at   int // seconds into day 5
		want float64
	}{
		{"quiet", 10, 1},
		{"spike", 42, 20},
		{"after the spike", 50, 1},
	}
	for _, tc := range tests {
		got, ok := f.rate(now + int64(tc.at)*int64(time.Second))
		if !ok || math.Abs(got-tc.want) > 0.5 {
			t.Errorf("%s: rate %v (ok %v), want %v ± 0.5", tc.name, got, ok, tc.want)
		}
	}
}

func TestForecasterWarmup(t *testing.T) {
	f := newForecaster(shortDay.withDefaults())
	start := epoch.UnixNano()
	if _, ok := f.rate(start); ok {
		t.Fatal("a forecast before any bucket closed")
	}
	// A steady ramp during the first season: Holt follows the trend upwards.
	for sec := range 30 {
		f.add(start+int64(sec)*int64(time.Second), float64(sec))
	}
	now := start + 30*int64(time.Second)
	f.advance(now)
	near, _ := f.rate(now)
	ahead, _ := f.rate(now + 10*int64(time.Second))
	if !(ahead > near && near > 20) {
		t.Errorf("ramp forecast %v now, %v 10 s ahead; want rising and above 20", near, ahead)
	}
}

func TestForecasterGapAndNegative(t *testing.T) {
	f := newForecaster(shortDay.withDefaults())
	start := epoch.UnixNano()
	for sec := range 120 {
		f.add(start+int64(sec)*int64(time.Second), 100)
	}
	// A week of silence replays at most two seasons and forecasts near zero,
	// never below it.
	later := start + int64(7*24*time.Hour)
	f.advance(later)
	got, ok := f.rate(later)
	if !ok || got < 0 || got > 1 {
		t.Errorf("after a long gap: rate %v (ok %v), want in [0, 1]", got, ok)
	}
}

func (s Seasonality) withDefaults() Seasonality {
	return Config{Seasonality: s}.withDefaults().Seasonality
}

func TestPredictiveFloor(t *testing.T) {
	cfg := Config{
		ColdStart:   5 * time.Second,
		AvgLatency:  2 * time.Second,
		Seasonality: shortDay,
	}
	// Four days of traffic, then a decision during day 5.
	day5 := epoch.Add(4 * time.Minute)
	// Spike forecast 20 req/s × 2 s / target 8 → 5; quiet 1 × 2 / 8 → 1.
	tests := []struct {
		name      string
		at        int // seconds into day 5
		load      float64
		wantFloor int
		wantMin   int
		signal    string
	}{
		{"quiet, no load", 10, 0, 1, 1, SignalPredictive},
		{"one cold start before the spike", 36, 0, 5, 5, SignalPredictive},
		{"floor never lowers desired", 36, 80, 5, 10, SignalConcurrency},
		{"quiet floor under heavy load", 20, 80, 1, 10, SignalConcurrency},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAutoscaler(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for sec := range 4*60 + tc.at {
				now := epoch.Add(time.Duration(sec) * time.Second)
				a.RecordArrivals(now, dailyRate(sec))
				a.Record(now, tc.load)
			}
			d := a.Decide(day5.Add(time.Duration(tc.at)*time.Second), Signals{Ready: 1})
			if d.PredictiveFloor != tc.wantFloor {
				t.Errorf("floor %d (%s), want %d", d.PredictiveFloor, d.Reason, tc.wantFloor)
			}
			if d.Desired < tc.wantMin || d.Desired < d.PredictiveFloor || d.Signal != tc.signal {
				t.Errorf("desired %d by %s (%s), want >= %d by %s", d.Desired, d.Signal, d.Reason, tc.wantMin, tc.signal)
			}
		})
	}

	// The floor rises ahead of the spike: it reaches the spike's size a cold
	// start before the spike begins, not after.
	b, _ := NewAutoscaler(cfg)
	firstHigh := -1
	for sec := range 5 * 60 {
		now := epoch.Add(time.Duration(sec) * time.Second)
		b.RecordArrivals(now, dailyRate(sec))
		d := b.Decide(now, Signals{Ready: 1})
		if sec >= 4*60 && firstHigh < 0 && d.PredictiveFloor >= 5 {
			firstHigh = sec - 4*60
		}
	}
	if firstHigh < 0 || firstHigh > 40-5 {
		t.Errorf("floor first reached 5 at second %d of day 5, want by second 35 (spike at 40, cold start 5 s)", firstHigh)
	}
}

func TestPredictiveFloorOff(t *testing.T) {
	// Without any latency the floor is off, however busy the forecast.
	a, err := NewAutoscaler(Config{Seasonality: shortDay})
	if err != nil {
		t.Fatal(err)
	}
	for sec := range 120 {
		a.RecordArrivals(epoch.Add(time.Duration(sec)*time.Second), 500)
	}
	d := a.Decide(epoch.Add(2*time.Minute), Signals{Ready: 1})
	if d.PredictiveFloor != 0 || d.Desired != 0 {
		t.Errorf("floor %d desired %d (%s), want 0 and 0", d.PredictiveFloor, d.Desired, d.Reason)
	}
	// Signals.AvgLatency switches it on: 500 req/s × 0.1 s / 8 → 7.
	d = a.Decide(epoch.Add(2*time.Minute), Signals{Ready: 1, AvgLatency: 100 * time.Millisecond})
	if d.PredictiveFloor != 7 || d.Desired != 7 {
		t.Errorf("floor %d desired %d (%s), want 7 and 7", d.PredictiveFloor, d.Desired, d.Reason)
	}
}

func TestPredictiveFloorLetsRareTrafficGoToZero(t *testing.T) {
	// One request a minute, a 1 s cold start: fewer than one arrival is
	// expected during a cold start, so the floor does not hold a replica.
	a, err := NewAutoscaler(Config{Seasonality: shortDay, ColdStart: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for m := range 5 {
		a.RecordArrivals(epoch.Add(time.Duration(m)*time.Minute), 1)
	}
	d := a.Decide(epoch.Add(5*time.Minute), Signals{AvgLatency: 100 * time.Millisecond})
	if d.PredictiveFloor != 0 || d.Desired != 0 {
		t.Errorf("floor %d desired %d (%s), want 0 and 0", d.PredictiveFloor, d.Desired, d.Reason)
	}
}

// TestPredictiveFloorFallsWhenArrivalsStop checks that the forecast's
// smoothed level cannot hold an idle deployment up: a StableWindow after
// the last arrival the floor is zero, where plain Holt smoothing would
// keep forecasting the old rate for minutes.
func TestPredictiveFloorFallsWhenArrivalsStop(t *testing.T) {
	// Ten minutes at 1 req/s: 1 × 2 s / 8 → a floor of 1.
	cfg := Config{ColdStart: 5 * time.Second, AvgLatency: 2 * time.Second}
	last := epoch.Add(599 * time.Second) // the last arrival
	for _, tc := range []struct {
		name  string
		after time.Duration // since the last arrival
		want  int
	}{
		{"during traffic", time.Second, 1},
		{"just inside a window", time.Minute - time.Second, 1},
		{"a window later", time.Minute, 0},
		{"ten minutes later", 10 * time.Minute, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAutoscaler(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for sec := range 600 {
				a.RecordArrivals(epoch.Add(time.Duration(sec)*time.Second), 1)
			}
			d := a.Decide(last.Add(tc.after), Signals{})
			if d.PredictiveFloor != tc.want {
				t.Errorf("floor %d (%s), want %d", d.PredictiveFloor, d.Reason, tc.want)
			}
		})
	}
}

// TestPredictiveFloorSeasonalRiseWhileIdle checks that an idle deployment
// still gets its floor ahead of a spike the season has taught: silence
// between spikes drops the smoothed level, not the seasonal rise.
func TestPredictiveFloorSeasonalRiseWhileIdle(t *testing.T) {
	cfg := Config{ColdStart: 5 * time.Second, AvgLatency: 2 * time.Second, Seasonality: shortDay,
		StableWindow: 10 * time.Second, PanicWindow: time.Second}
	spikeOnly := func(sec int) int { // 20 req/s in seconds [40, 45), else nothing
		if s := sec % 60; s >= 40 && s < 45 {
			return 20
		}
		return 0
	}
	for _, tc := range []struct {
		name     string
		at       int // seconds into day 5
		min, max int // floor bounds
	}{
		{"one cold start before the spike", 36, 4, 5},
		{"quiet part of the day", 20, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAutoscaler(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for sec := range 4*60 + tc.at {
				a.RecordArrivals(epoch.Add(time.Duration(sec)*time.Second), spikeOnly(sec))
			}
			d := a.Decide(epoch.Add(time.Duration(4*60+tc.at)*time.Second), Signals{})
			if d.PredictiveFloor < tc.min || d.PredictiveFloor > tc.max {
				t.Errorf("floor %d (%s), want %d..%d", d.PredictiveFloor, d.Reason, tc.min, tc.max)
			}
		})
	}
}
