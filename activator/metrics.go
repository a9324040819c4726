package activator

import (
	"bytes"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/internal/openai"
)

// Metrics are the activator's stoke_* series.
type Metrics struct {
	requests *prometheus.CounterVec
	ttfb     *prometheus.HistogramVec
	tpot     *prometheus.HistogramVec
	itl      *prometheus.HistogramVec
	duration *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	fallback *prometheus.CounterVec
}

// NewMetrics registers the activator's series on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1, 2.5, 5, 10, 30, 60}
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_requests_total",
			Help: "Inference requests answered, by model and HTTP status code."}, []string{"model", "code"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "stoke_time_to_first_token_seconds",
			Help: "Time from a request's arrival to the first byte of its answer (the first token of a stream), buffering and cold starts included.", Buckets: buckets}, []string{"model"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "stoke_request_duration_seconds",
			Help: "Time from a request's arrival to the end of its answer.", Buckets: buckets}, []string{"model"}),
		tpot: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "stoke_time_per_output_token_seconds",
			Help:    "Mean time between a stream's events after the first, per streamed request.",
			Buckets: []float64{0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1}}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "stoke_inter_token_latency_seconds",
			Help:    "Time between two writes of a stream to its client (a token event each, but for the usage and closing events), by the deployment or provider that served it.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5}}, []string{"model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_tokens_total",
			Help: "Tokens processed, by model and kind (prompt or completion), from the answers' usage."}, []string{"model", "kind"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_fallbacks_total",
			Help: "Requests a route passed from one target to the next of its fallback chain, and why (no_capacity, failed, breaker_open, buffer_full, shed, context_length, unknown)."},
			[]string{"route", "from", "to", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.ttfb, m.duration, m.tpot, m.itl, m.tokens, m.fallback)
	}
	return m
}

// itlOf is the inter-token latency observer of target's streams (nil
// without metrics).
func (m *Metrics) itlOf(target string) prometheus.Observer {
	if m == nil {
		return nil
	}
	return m.itl.WithLabelValues(target)
}

// fallbacks counts a request route passed from target from to to.
func (m *Metrics) fallbacks(route, from, to, reason string) {
	if m != nil {
		m.fallback.WithLabelValues(route, from, to, reason).Inc()
	}
}

// registerGauges exports a's queue and in-flight counts.
func (m *Metrics) registerGauges(reg prometheus.Registerer, a *Activator) {
	if reg == nil {
		return
	}
	reg.MustRegister(gaugeFunc{a: a, desc: prometheus.NewDesc("stoke_activator_queue_length", "Requests waiting for a replica, by model.", []string{"model"}, nil),
		value: func(r *route) float64 { return float64(r.waiting.Load()) }})
	reg.MustRegister(gaugeFunc{a: a, desc: prometheus.NewDesc("stoke_activator_in_flight", "Requests being proxied to a replica, by model.", []string{"model"}, nil),
		value: func(r *route) float64 { return float64(r.inflight.Load()) }})
}

// gaugeFunc reads a per-deployment value at scrape time.
type gaugeFunc struct {
	a     *Activator
	desc  *prometheus.Desc
	value func(*route) float64
}

func (g gaugeFunc) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g gaugeFunc) Collect(ch chan<- prometheus.Metric) {
	g.a.mu.RLock()
	defer g.a.mu.RUnlock()
	for name, r := range g.a.deps {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, g.value(r), name)
	}
}

// recorder notes a response's status, when its first and last bytes went
// out, and reads its usage (and, for a stream, counts its events) as the
// bytes pass (see answerUsage).
type recorder struct {
	http.ResponseWriter
	status  int
	first   time.Time
	last    time.Time
	started bool // the answer's kind (stream or not) is known
	usage   answerUsage
	queued  bool // waited in the buffer for a replica
	// itl, when set, observes the gaps between a stream's writes.
	itl prometheus.Observer
	// route, served and fallbacks are Outcome's.
	route, served string
	fallbacks     int
	// done, when set, hears how an admitted request ended; with hold, the
	// end of a successful answer waits in held until it has.
	done func(Outcome)
	hold bool
	held []byte
}

// doneMarker ends a stream: a stream's held end.
var doneMarker = []byte("data: [DONE]\n\n")

// passOn writes p to the client, keeping back the answer's end when the
// recorder holds it: the last byte of a plain answer, the [DONE] event of
// a stream.
func (r *recorder) passOn(p []byte) (int, error) {
	if !r.hold || r.status != http.StatusOK || len(p) == 0 {
		return r.ResponseWriter.Write(p)
	}
	if r.usage.sse {
		if bytes.HasSuffix(p, doneMarker) {
			r.held = append(r.held, p...)
			return len(p), nil
		}
		return r.ResponseWriter.Write(p)
	}
	if len(r.held) > 0 {
		if _, err := r.ResponseWriter.Write(r.held); err != nil {
			return 0, err
		}
	}
	r.held = append(r.held[:0], p[len(p)-1])
	if _, err := r.ResponseWriter.Write(p[:len(p)-1]); err != nil {
		return 0, err
	}
	return len(p), nil
}

// release sends what was held back.
func (r *recorder) release() {
	if len(r.held) > 0 {
		r.ResponseWriter.Write(r.held)
		r.held = nil
	}
}

func (r *recorder) WriteHeader(code int) {
	if code >= 200 && r.status == 0 { // 1xx are interim
		r.status = code
		r.start()
	}
	r.ResponseWriter.WriteHeader(code)
}

// start notes whether the answer, whose headers are now set, is a stream.
func (r *recorder) start() {
	if !r.started {
		r.started = true
		r.usage.sse = isEventStream(r.Header().Get("Content-Type"))
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
		r.start()
	}
	now := time.Now()
	if r.first.IsZero() {
		r.first = now
	} else if r.itl != nil && r.usage.sse {
		r.itl.Observe(now.Sub(r.last).Seconds())
	}
	r.last = now
	r.usage.write(p)
	return r.passOn(p)
}

// Unwrap lets http.ResponseController reach the real writer (Flush).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (m *Metrics) observe(model string, rec *recorder, start time.Time) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(model, strconv.Itoa(rec.status)).Inc()
	if rec.status == http.StatusOK && !rec.first.IsZero() {
		m.ttfb.WithLabelValues(model).Observe(rec.first.Sub(start).Seconds())
	}
	m.duration.WithLabelValues(model).Observe(time.Since(start).Seconds())
	if events := rec.usage.events(); events > 2 { // a stream: events and the closing [DONE]
		m.tpot.WithLabelValues(model).Observe(rec.last.Sub(rec.first).Seconds() / float64(events-2))
	}
	if u, ok := rec.usage.result(); ok && u.PromptTokens+u.CompletionTokens > 0 {
		m.tokens.WithLabelValues(model, "prompt").Add(float64(u.PromptTokens))
		m.tokens.WithLabelValues(model, "completion").Add(float64(u.CompletionTokens))
	}
}

// usageOf reads the usage of a whole answer: the body of a plain answer,
// or the last event with usage of a stream (an answer whose first
// non-blank byte starts an SSE line: "data:", another field or a comment,
// not a JSON object).
func usageOf(answer []byte) (openai.Usage, bool) {
	var a answerUsage
	if rest := bytes.TrimLeft(answer, " \t\r\n"); len(rest) > 0 && rest[0] != '{' {
		a.sse = true
	}
	a.write(answer)
	u, ok := a.result()
	return u, ok && u.PromptTokens+u.CompletionTokens > 0
}
