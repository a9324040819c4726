package runtime

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the node's runtimes by state and model
// (stoke_runtimes{state,model}) and the weights its acquisitions loaded
// (stoke_weight_bytes_loaded_total and stoke_weight_load_seconds, by
// the tier they came from: t2 node cache, t3 bucket).
func (m *Manager) Collector() prometheus.Collector { return runtimesCollector{m} }

var runtimesDesc = prometheus.NewDesc("stoke_runtimes", "Engine runtimes on this node, by state and model.", []string{"state", "model"}, nil)

// loadMetrics counts the weights loaded into runtimes.
type loadMetrics struct {
	bytes   *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

func newLoadMetrics() loadMetrics {
	return loadMetrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_weight_bytes_loaded_total",
			Help: "Weight bytes loaded into runtimes, by the tier they came from (t2 node cache, t3 bucket)."}, []string{"tier"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "stoke_weight_load_seconds",
			Help:    "Time to load a revision's weights into a runtime, by the tier they came from.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120}}, []string{"tier"}),
	}
}

// observe records one load of bytes from tier.
func (l loadMetrics) observe(tier string, bytes int64, seconds float64) {
	l.bytes.WithLabelValues(tier).Add(float64(bytes))
	l.seconds.WithLabelValues(tier).Observe(seconds)
}

type runtimesCollector struct{ m *Manager }

func (c runtimesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- runtimesDesc
	c.m.loads.bytes.Describe(ch)
	c.m.loads.seconds.Describe(ch)
}

func (c runtimesCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ state, model string }
	counts := map[key]int{}
	for _, r := range c.m.Runtimes() {
		counts[key{string(r.State), r.Model}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(runtimesDesc, prometheus.GaugeValue, float64(n), k.state, k.model)
	}
	c.m.loads.bytes.Collect(ch)
	c.m.loads.seconds.Collect(ch)
}
