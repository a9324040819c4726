package reconcile

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// replicaMeter integrates a deployment's replicas over time: the
// replica-seconds it held (acquisitions in progress, ready and draining
// replicas) and what they cost at its spec's cost.replica_hourly_usd.
type replicaMeter struct {
	since   time.Time
	seconds float64
	usd     float64
}

// meter brings d's replica-seconds and cost up to now; call it before
// anything changes its replica count or its spec, and before reading them.
// c.mu is held.
func (d *deployment) meter(now time.Time) {
	m := &d.cost
	if !m.since.IsZero() && now.After(m.since) {
		held := float64(len(d.replicas)+d.pending) * now.Sub(m.since).Seconds()
		m.seconds += held
		m.usd += held * d.spec.Cost.ReplicaHourlyUSD / 3600
	}
	if now.After(m.since) {
		m.since = now
	}
}

// costCollector exports the deployments' replica-seconds, operating cost
// and cost per million tokens served, read at each scrape.
type costCollector struct {
	c                   *Controller
	seconds, usd, per1M *prometheus.Desc
}

func newCostCollector(c *Controller) *costCollector {
	return &costCollector{c: c,
		seconds: prometheus.NewDesc("stoke_replica_seconds_total",
			"Replica-seconds a deployment held: from the start of each replica's cold start to its release.", []string{"model"}, nil),
		usd: prometheus.NewDesc("stoke_operating_cost_usd_total",
			"What a deployment's replicas cost to run, in US dollars, at its spec's cost.replica_hourly_usd.", []string{"model"}, nil),
		per1M: prometheus.NewDesc("stoke_cost_per_1m_tokens",
			"Operating cost per million tokens (prompt and completion) a deployment served, in US dollars, since serve started; only for deployments with cost.replica_hourly_usd.", []string{"model"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (cc *costCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cc.seconds
	ch <- cc.usd
	ch <- cc.per1M
}

// Collect implements prometheus.Collector.
func (cc *costCollector) Collect(ch chan<- prometheus.Metric) {
	type reading struct {
		name         string
		seconds, usd float64
		priced       bool
	}
	now := time.Now()
	cc.c.mu.Lock()
	readings := make([]reading, 0, len(cc.c.deps))
	for name, d := range cc.c.deps {
		d.meter(now)
		readings = append(readings, reading{name, d.cost.seconds, d.cost.usd, d.spec.Cost.ReplicaHourlyUSD > 0})
	}
	cc.c.mu.Unlock()
	for _, r := range readings {
		ch <- prometheus.MustNewConstMetric(cc.seconds, prometheus.CounterValue, r.seconds, r.name)
		ch <- prometheus.MustNewConstMetric(cc.usd, prometheus.CounterValue, r.usd, r.name)
		if tokens := cc.c.opts.Router.Tokens(r.name); r.priced && tokens > 0 {
			ch <- prometheus.MustNewConstMetric(cc.per1M, prometheus.GaugeValue, r.usd/float64(tokens)*1e6, r.name)
		}
	}
}
