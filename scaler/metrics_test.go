package scaler

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// gathered maps "name{label=value,...}" to the value of every series in reg.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName() + "{"
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			key += "}"
			out[key] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return -1
}

// TestMetrics checks the series: the gauges follow every decision, and
// stoke_scaler_decisions_total counts only the decisions that changed the
// desired count, under the signal that set the new count.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	again := NewMetrics(reg) // a second registration feeds the same series

	for _, o := range []struct {
		m          *Metrics
		deployment string
		d          Decision
	}{
		{m, "llama", Decision{Desired: 5, Panic: true, Signal: SignalConcurrency, PredictiveFloor: 2}}, // 0 → 5
		{again, "llama", Decision{Desired: 4, Signal: SignalPanicHold}},                                // 5 → 4
		{m, "llama", Decision{Desired: 4, Signal: SignalPanicHold}},                                    // unchanged
		{m, "llama", Decision{Desired: 4, Signal: SignalScaleDownDelay}},                               // unchanged
		{again, "llama", Decision{Desired: 4, Signal: SignalQueue}},                                    // unchanged
		{m, "qwen", Decision{Desired: 1}},                                                              // 0 → 1
		{m, "mistral", Decision{Desired: 0, Signal: SignalIdle}},                                       // starts at 0
		{m, "phi", Decision{Desired: 2, Signal: SignalQueueWait}},                                      // 0 → 2
		{m, "phi", Decision{Desired: 0, Signal: SignalIdle}},                                           // 2 → 0
	} {
		o.m.Observe(o.deployment, o.d)
	}

	got := gathered(t, reg)
	tests := []struct {
		series string
		want   float64 // -1: absent
	}{
		{"stoke_scaler_desired_replicas{deployment=llama}", 4},
		{"stoke_scaler_panic{deployment=llama}", 0},
		{"stoke_scaler_predictive_floor_replicas{deployment=llama}", 0},
		{"stoke_scaler_decisions_total{deployment=llama,signal=concurrency}", 1},
		{"stoke_scaler_decisions_total{deployment=llama,signal=panic_hold}", 1},
		{"stoke_scaler_decisions_total{deployment=llama,signal=scale_down_delay}", -1},
		{"stoke_scaler_decisions_total{deployment=llama,signal=queue}", -1},
		{"stoke_scaler_decisions_total{deployment=qwen,signal=unknown}", 1},
		{"stoke_scaler_desired_replicas{deployment=qwen}", 1},
		{"stoke_scaler_desired_replicas{deployment=mistral}", 0},
		{"stoke_scaler_decisions_total{deployment=mistral,signal=idle}", -1},
		{"stoke_scaler_decisions_total{deployment=phi,signal=queue_wait}", 1},
		{"stoke_scaler_decisions_total{deployment=phi,signal=idle}", 1},
		{"stoke_scaler_desired_replicas{deployment=phi}", 0},
	}
	for _, tc := range tests {
		v, ok := got[tc.series]
		if tc.want < 0 {
			if ok {
				t.Errorf("%s = %v, want no such series", tc.series, v)
			}
			continue
		}
		if !ok || v != tc.want {
			t.Errorf("%s = %v (present %v), want %v", tc.series, v, ok, tc.want)
		}
	}

	m.Observe("llama", Decision{Desired: 6, Panic: true, Signal: SignalQueue})
	if got := gathered(t, reg); got["stoke_scaler_panic{deployment=llama}"] != 1 {
		t.Errorf("panic gauge %v after a panicking decision, want 1", got["stoke_scaler_panic{deployment=llama}"])
	}

	m.Forget("llama")
	for series := range gathered(t, reg) {
		if strings.Contains(series, "deployment=llama") {
			t.Errorf("%s survived Forget", series)
		}
	}

	NewMetrics(nil).Observe("x", Decision{Desired: 1}) // unregistered: must not fail
}
