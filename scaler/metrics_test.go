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

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	again := NewMetrics(reg) // a second registration feeds the same series

	m.Observe("llama", Decision{Desired: 5, Panic: true, Signal: SignalConcurrency, PredictiveFloor: 2})
	again.Observe("llama", Decision{Desired: 4, Panic: false, Signal: SignalPanicHold})
	m.Observe("llama", Decision{Desired: 4, Signal: SignalPanicHold})
	m.Observe("qwen", Decision{Desired: 1})

	got := gathered(t, reg)
	tests := []struct {
		series string
		want   float64
	}{
		{"stoke_scaler_desired_replicas{deployment=llama}", 4},
		{"stoke_scaler_panic{deployment=llama}", 0},
		{"stoke_scaler_predictive_floor_replicas{deployment=llama}", 0},
		{"stoke_scaler_decisions_total{deployment=llama,signal=concurrency}", 1},
		{"stoke_scaler_decisions_total{deployment=llama,signal=panic_hold}", 2},
		{"stoke_scaler_decisions_total{deployment=qwen,signal=unknown}", 1},
		{"stoke_scaler_desired_replicas{deployment=qwen}", 1},
	}
	for _, tc := range tests {
		if v, ok := got[tc.series]; !ok || v != tc.want {
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
