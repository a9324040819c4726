package scaler

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics exports the scaler's decisions as Prometheus series labelled by
// deployment. One Metrics serves every deployment of a process.
type Metrics struct {
	mu        sync.Mutex // orders Observe's read of the previous count and its update
	desired   *prometheus.GaugeVec
	panic     *prometheus.GaugeVec
	floor     *prometheus.GaugeVec
	decisions *prometheus.CounterVec
}

// NewMetrics creates the scaler's series and registers them on reg (nil
// skips registration, e.g. in tests that only call Observe). Registering on
// a registry that already holds them reuses the registered collectors, so
// two NewMetrics on one registry feed the same series; collectors that clash
// with something else stay unregistered rather than failing the caller.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		desired: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stoke_scaler_desired_replicas",
			Help: "Replica count the scaler last decided for the deployment.",
		}, []string{"deployment"}),
		panic: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stoke_scaler_panic",
			Help: "1 while the deployment's autoscaler is in panic mode, else 0.",
		}, []string{"deployment"}),
		floor: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stoke_scaler_predictive_floor_replicas",
			Help: "Replica floor from the deployment's arrival-rate forecast one cold start ahead.",
		}, []string{"deployment"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stoke_scaler_decisions_total",
			Help: "Scaler decisions that changed the deployment's desired replica count, by the signal or rule that set the new count.",
		}, []string{"deployment", "signal"}),
	}
	if reg != nil {
		m.desired = register(reg, m.desired)
		m.panic = register(reg, m.panic)
		m.floor = register(reg, m.floor)
		m.decisions = register(reg, m.decisions)
	}
	return m
}

// register registers c on reg and returns the collector that ends up
// exported: c itself, or the identical one registered before.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		if existing, ok := dup.ExistingCollector.(C); ok {
			return existing
		}
	}
	return c
}

// Observe exports decision d of deployment: the desired-count, panic and
// floor gauges always, and one more decision in
// stoke_scaler_decisions_total when d.Desired differs from the previous
// decision's (a deployment starts at zero). Call it for every decision.
func (m *Metrics) Observe(deployment string, d Decision) {
	m.mu.Lock()
	defer m.mu.Unlock()
	desired := m.desired.WithLabelValues(deployment)
	changed := gaugeValue(desired) != float64(d.Desired)
	desired.Set(float64(d.Desired))
	p := 0.0
	if d.Panic {
		p = 1
	}
	m.panic.WithLabelValues(deployment).Set(p)
	m.floor.WithLabelValues(deployment).Set(float64(d.PredictiveFloor))
	if !changed {
		return
	}
	signal := d.Signal
	if signal == "" {
		signal = "unknown"
	}
	m.decisions.WithLabelValues(deployment, signal).Inc()
}

// gaugeValue reads g's current value (the previous decision's count; 0 for
// a new series). Reading the exported gauge rather than keeping a copy
// keeps two Metrics on one registry in agreement.
func gaugeValue(g prometheus.Gauge) float64 {
	var out dto.Metric
	if err := g.Write(&out); err != nil {
		return 0
	}
	return out.GetGauge().GetValue()
}

// Forget deletes every series of deployment, when it is removed.
func (m *Metrics) Forget(deployment string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	labels := prometheus.Labels{"deployment": deployment}
	m.desired.Delete(labels)
	m.panic.Delete(labels)
	m.floor.Delete(labels)
	m.decisions.DeletePartialMatch(labels)
}
