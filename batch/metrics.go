package batch

import "github.com/prometheus/client_golang/prometheus"

// metrics are the stoke_batch_* series.
type metrics struct {
	lines       *prometheus.CounterVec
	preemptions *prometheus.CounterVec
	retries     *prometheus.CounterVec
	batches     *prometheus.CounterVec
	inflight    prometheus.Gauge
	pending     prometheus.Gauge
	resumed     prometheus.Counter
	limit       *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		lines: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_batch_lines_total",
			Help: "Batch lines recorded, by result (succeeded, failed); its rate is the lines/s."}, []string{"result"}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_batch_preemptions_total",
			Help: "Batch lines cut short and requeued because their capacity was taken back, by cause (interactive, spot)."}, []string{"cause"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_batch_retries_total",
			Help: "Batch lines requeued after an answer that was not theirs to keep (no capacity, an engine error, no answer in time), by HTTP status or timeout."}, []string{"code"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_batch_batches_total",
			Help: "Batches that reached a final status, by status."}, []string{"status"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stoke_batch_lines_in_flight",
			Help: "Batch lines being answered now."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stoke_batch_lines_pending",
			Help: "Lines of running batches not answered yet (in flight included)."}),
		resumed: prometheus.NewCounter(prometheus.CounterOpts{Name: "stoke_batch_resumed_total",
			Help: "Batches found unfinished when the runner started, and resumed from their records."}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stoke_batch_concurrency_limit",
			Help: "The adaptive bound on a model's batch lines in flight."}, []string{"model"}),
	}
	if reg != nil {
		reg.MustRegister(m.lines, m.preemptions, m.retries, m.batches, m.inflight, m.pending, m.resumed, m.limit)
	}
	return m
}
