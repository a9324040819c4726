package core

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the engine's Prometheus series, under vLLM's names so that
// routers and autoscalers built for vLLM read them unchanged.
type Metrics struct {
	running, waiting, kvUsage prometheus.Gauge
	prefixQueries, prefixHits prometheus.Counter
	promptTokens, genTokens   prometheus.Counter
	ttft, itl, e2e            prometheus.Histogram
	finished                  *prometheus.CounterVec
	preemptions               prometheus.Counter
	spec                      specMetrics
	lora                      *loraCollector // the adapter pool's series, once an engine with one starts
	lastQueries, lastHits     int64
	lastPreemptions           uint64
	collectors                []prometheus.Collector
}

// NewMetrics registers the engine's series on reg, labelled with the
// served model's name.
func NewMetrics(reg prometheus.Registerer, modelName string) *Metrics {
	labels := prometheus.Labels{"model_name": modelName}
	var collectors []prometheus.Collector
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
		collectors = append(collectors, g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		collectors = append(collectors, c)
		return c
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
		collectors = append(collectors, h)
		return h
	}
	latency := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	m := &Metrics{
		running:       gauge("vllm:num_requests_running", "Requests in the running batch."),
		waiting:       gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled."),
		kvUsage:       gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full)."),
		prefixQueries: counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
		prefixHits:    counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."),
		promptTokens:  counter("vllm:prompt_tokens_total", "Prompt tokens of requests that reached their first token or, generating none, computed their prompt."),
		genTokens:     counter("vllm:generation_tokens_total", "Generated tokens."),
		preemptions:   counter("vllm:num_preemptions_total", "Requests preempted to free KV blocks (recomputed later)."),
		ttft:          histogram("vllm:time_to_first_token_seconds", "Time from arrival to the first token.", latency),
		itl:           histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a request.", latency),
		e2e:           histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the end of a request.", latency),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
			Help: "Finished requests by reason.", ConstLabels: labels}, []string{"finished_reason"}),
	}
	m.spec = newSpecMetrics(labels)
	m.lora = newLoRACollector(modelName)
	m.collectors = append(collectors, m.finished)
	m.collectors = append(m.collectors, m.spec.collectors()...)
	m.collectors = append(m.collectors, m.lora)
	reg.MustRegister(m.collectors...)
	return m
}

// Unregister removes the series from reg, when the model they describe is
// unloaded.
func (m *Metrics) Unregister(reg prometheus.Registerer) {
	for _, c := range m.collectors {
		reg.Unregister(c)
	}
}

func (m *Metrics) observeStats(s *Stats) {
	m.running.Set(float64(s.Running))
	m.waiting.Set(float64(s.Waiting))
	m.kvUsage.Set(s.KVUsage)
	if s.PrefixQueries < m.lastQueries || s.PrefixHits < m.lastHits || s.Preemptions < m.lastPreemptions {
		m.lastQueries, m.lastHits, m.lastPreemptions = 0, 0, 0 // a new engine (after a wake) counts from zero
	}
	m.preemptions.Add(float64(s.Preemptions - m.lastPreemptions))
	m.lastPreemptions = s.Preemptions
	m.prefixQueries.Add(float64(s.PrefixQueries - m.lastQueries))
	m.prefixHits.Add(float64(s.PrefixHits - m.lastHits))
	m.lastQueries, m.lastHits = s.PrefixQueries, s.PrefixHits
}

func (m *Metrics) observeToken(r *request, now time.Time) {
	m.genTokens.Inc()
	if r.lora != nil {
		r.lora.entry.tokens.Add(1)
	}
	if len(r.sreq.Output) == 1 {
		m.ttft.Observe(now.Sub(r.arrived).Seconds())
		m.promptTokens.Add(float64(len(r.sreq.Prompt)))
		return
	}
	if now.Equal(r.lastTok) {
		return // a later token of the same step (speculative decoding): no gap
	}
	m.itl.Observe(now.Sub(r.lastTok).Seconds())
}

// observePromptOnly counts the prompt of a request that generates nothing
// (it only scores its prompt), which never reaches a first token.
func (m *Metrics) observePromptOnly(r *request) {
	m.promptTokens.Add(float64(len(r.sreq.Prompt)))
}

func (m *Metrics) observeFinish(r *request, reason string, now time.Time) {
	m.e2e.Observe(now.Sub(r.arrived).Seconds())
	m.finished.WithLabelValues(reason).Inc()
}
