package runtime

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the node's runtimes by state, and by model for those
// holding one, as stoke_runtimes{state,model}.
func (m *Manager) Collector() prometheus.Collector { return runtimesCollector{m} }

var runtimesDesc = prometheus.NewDesc("stoke_runtimes", "Engine runtimes on this node, by state and model.", []string{"state", "model"}, nil)

type runtimesCollector struct{ m *Manager }

func (c runtimesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- runtimesDesc }

func (c runtimesCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ state, model string }
	counts := map[key]int{}
	for _, r := range c.m.Runtimes() {
		counts[key{string(r.State), r.Model}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(runtimesDesc, prometheus.GaugeValue, float64(n), k.state, k.model)
	}
}
