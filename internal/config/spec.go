// Package config is the deployment spec: what a pushed stoke.yaml may say
// about how its model is served, with the defaults for what it leaves out.
package config

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Spec is a deployment's serving configuration. Durations are Go duration
// strings in JSON ("60s"). Every field has bounds, checked by Validate: a
// spec is operator input (a pushed stoke.yaml, a PUT on the admin API) and
// the scaler and the activator size loops, queues and timers by it, so a
// value past the bounds is refused rather than served. Bounds that depend on
// the node (its slots) are checked by CheckNode.
type Spec struct {
	Replicas Replicas `json:"replicas"`
	// TargetConcurrency is the in-flight requests one replica should
	// carry; the scaler sizes the deployment by it.
	//
	// Bounds: [MinTargetConcurrency, MaxTargetConcurrency] = [0.01,
	// 100000]. The scaler wants ceil(load/target) replicas: below 0.01 one
	// request in flight would ask for a hundred replicas (1e-300 asks for
	// an infinity), and no engine carries more than 100000 sequences at
	// once (vLLM's max_num_seqs is in the hundreds), so a larger target
	// would never scale out.
	TargetConcurrency float64 `json:"target_concurrency"`
	// TTFTSLO is the time to first token the scaler defends: when the p90
	// of requests' waits for a replica (in the activator's buffer, over
	// the window) exceeds it, the deployment gets one more replica. Compute
	// time is left out: more replicas on the same node cannot shorten it.
	//
	// Bounds: [10ms, 1h]. Below 10ms the wait for a replica is within the
	// noise of scheduling a request (1ns would add a replica on every
	// request that waits at all); above an hour it defends nothing (the
	// buffer times requests out at most after an hour).
	TTFTSLO Duration `json:"ttft_slo"`
	// Window is the scaler's stable window: concurrency is averaged over
	// it (the panic window is a tenth of it), as Knative's
	// autoscaling.knative.dev/window.
	//
	// Bounds: [1s, 1h]. A shorter window leaves the panic window under a
	// tenth of a second, fewer samples than it needs; Knative caps its
	// window at an hour too, past which the average no longer follows
	// load.
	Window Duration `json:"window"`
	// IdleDelay is how long load must stay lower before replicas are
	// released (to sleep or to the warm pool).
	//
	// Bounds: [0, 24h]. Zero releases as soon as load drops; keeping
	// replicas idle longer than a day is what replicas.min is for.
	IdleDelay Duration `json:"idle_delay"`
	// Buffer bounds the requests waiting for a replica.
	Buffer Buffer `json:"buffer"`
	// Price is what the deployment's tokens cost tenants, in US dollars
	// per million tokens (tenants' money budgets are charged by it); zero
	// is free.
	//
	// Bounds: [0, 10000] each. No model is priced above $10,000 per
	// million tokens (the dearest list prices are in the hundreds); a
	// larger one is a typo.
	Price Price `json:"price"`
	// Cost is what the deployment costs to run, for the operating cost
	// per token (stoke_cost_per_1m_tokens); zero leaves it unmeasured.
	Cost Cost `json:"cost"`
	// Forecast configures the arrival-rate forecast behind the scaler's
	// predictive floor.
	Forecast Forecast `json:"forecast"`
	// Rollout is how a newly pushed revision replaces the one served:
	// at once (the default), or first as a canary, promoted by an eval
	// gate or by hand.
	Rollout Rollout `json:"rollout"`
	// Speculative is whether the deployment's requests use speculative
	// decoding where its engines have it (stoke serve
	// --speculative-config): on by default; false turns it off for the
	// requests that do not ask for it themselves ("speculative": true).
	Speculative bool `json:"speculative"`
}

// Forecast is how the scaler forecasts a deployment's arrivals: additive
// Holt-Winters over buckets of Bucket, with a season of Period (a day by
// default: traffic that repeats daily). The predictive floor keeps the
// replicas the forecast one cold start ahead asks for, so that a
// recurring rise finds them ready.
type Forecast struct {
	// Predictive turns the predictive floor on (the default) or off.
	Predictive bool `json:"predictive"`
	// Period is the length of one season.
	//
	// Bounds: [10s, 7 days], a whole number of buckets: a week is the
	// longest cycle traffic has (weekday and weekend), and a season under
	// ten seconds is noise.
	Period Duration `json:"period"`
	// Bucket is the width of one arrival count.
	//
	// Bounds: [1s, Period]: below a second the counts are noise, and a
	// week of one-second buckets is 604,800 numbers, well within what the
	// scaler keeps.
	Bucket Duration `json:"bucket"`
}

// Bounds of the forecast's fields.
const (
	MinForecastPeriod = 10 * time.Second
	MaxForecastPeriod = 7 * 24 * time.Hour
	MinForecastBucket = time.Second
)

func (f Forecast) validate() error {
	if err := f.Period.check("forecast.period", MinForecastPeriod, MaxForecastPeriod); err != nil {
		return err
	}
	if err := f.Bucket.check("forecast.bucket", MinForecastBucket, time.Duration(f.Period)); err != nil {
		return err
	}
	if p, b := time.Duration(f.Period), time.Duration(f.Bucket); p%b != 0 {
		return fieldErr("forecast.period", "%v is not a whole number of buckets of %v", p, b)
	}
	return nil
}

// Rollout is a deployment's rollout policy for new revisions. With
// neither a canary share nor an eval file, a new revision is served at
// once (replicas of the old one are replaced as the new ones get ready).
type Rollout struct {
	// CanaryPercent is the share of the deployment's requests the new
	// revision serves while it is a canary.
	//
	// Bounds: [0, 100]. With no eval file the canary keeps its share until
	// an operator promotes or rolls it back (as KServe's
	// canaryTrafficPercent); with one, the gate decides, and 0 runs the
	// eval with no live traffic on the candidate.
	CanaryPercent int `json:"canary_percent"`
	// Eval is the gate a canary must pass to be promoted.
	Eval Eval `json:"eval"`
}

// Gated reports whether new revisions go through a canary (with or
// without an eval gate) instead of being served at once.
func (r Rollout) Gated() bool { return r.CanaryPercent > 0 || r.Eval.File != "" }

// Eval is a rollout's eval gate: a set of prompts with reference
// answers scored on the stable and the candidate revision; the candidate
// is promoted unless its score is lower than the stable's by more than
// MaxRegression.
type Eval struct {
	// File is the eval set, a JSONL file pushed beside the weights (its
	// name in the pushed directory); each line is {"prompt": …,
	// "reference": …} with an optional "max_tokens". Empty: no gate.
	File string `json:"file"`
	// Metric is how an answer is scored: EvalExactMatch (the greedy
	// completion, trimmed, equals the trimmed reference; the score is the
	// fraction that do) or EvalLogLikelihood (the mean log-probability per
	// token of the reference after the prompt, teacher-forced).
	Metric string `json:"metric"`
	// MaxRegression is how much lower than the stable's the candidate's
	// score may be and still be promoted.
	//
	// Bounds: [0, 1] for exact match (a fraction of the set), [0, 100]
	// for log-likelihood (nats per token; a token's log-probability is
	// rarely below -20, so 100 already lets any model through).
	MaxRegression float64 `json:"max_regression"`
	// MaxTokens caps each exact-match completion (a line's own
	// max_tokens wins).
	//
	// Bounds: [1, 4096]: a reference is an answer, not a book.
	MaxTokens int `json:"max_tokens"`
	// Timeout bounds the whole eval, both revisions; past it the
	// candidate is rejected.
	//
	// Bounds: [1s, 24h].
	Timeout Duration `json:"timeout"`
}

// The eval metrics.
const (
	EvalExactMatch    = "exact_match"
	EvalLogLikelihood = "log_likelihood"
)

// Bounds of the rollout's fields.
const (
	MaxEvalTokens     = 4096
	MaxLogLikelihood  = 100
	MinEvalTimeout    = time.Second
	MaxEvalTimeout    = 24 * time.Hour
	DefaultEvalTokens = 32
)

// Cost is what running a deployment costs.
type Cost struct {
	// ReplicaHourlyUSD is one replica's cost per hour, in US dollars
	// (its GPUs' share of the instance price), counted from the start of
	// its cold start to its release.
	//
	// Bounds: [0, 1000]. The largest GPU instances (8 accelerators) list
	// below $100 an hour; a thousand is a typo.
	ReplicaHourlyUSD float64 `json:"replica_hourly_usd"`
}

// MaxReplicaHourlyUSD bounds Cost.ReplicaHourlyUSD.
const MaxReplicaHourlyUSD = 1000

// Price is a deployment's price per million tokens.
type Price struct {
	InputPer1M       float64 `json:"input_per_1m"`
	OutputPer1M      float64 `json:"output_per_1m"`
	CachedInputPer1M float64 `json:"cached_input_per_1m"`
}

// MaxPricePer1M bounds each price.
const MaxPricePer1M = 10000

// Cost is what prompt tokens (cached of them from the prefix cache) and
// completion tokens cost, in US dollars.
func (p Price) Cost(prompt, cached, completion int) float64 {
	return (float64(prompt-cached)*p.InputPer1M + float64(cached)*p.CachedInputPer1M + float64(completion)*p.OutputPer1M) / 1e6
}

// Replicas bounds a deployment's replica count.
type Replicas struct {
	// Min is the replicas kept however low the load.
	//
	// Bounds: [0, Max], and at most the node's slots (CheckNode): a
	// minimum the node cannot hold would be retried forever.
	Min int `json:"min"`
	// Max is the most replicas the scaler runs.
	//
	// Bounds: [1, MaxReplicas] = [1, 1024], at least Min, and at most the
	// node's slots (CheckNode). 1024 is far above the slots of any node
	// (one replica holds at least one GPU or a share of one) while keeping
	// the scaler's per-replica work bounded; 1000000 drove a million
	// acquire attempts.
	Max int `json:"max"`
	// Sleeping is the most released replicas kept asleep (weights in
	// host memory, woken in tier T1) within the node's sleep budget; the
	// rest go back to the warm pool. It defaults to Max.
	//
	// Bounds: [0, Max]: no more replicas can be asleep than can run.
	Sleeping int `json:"sleeping"`
}

// Buffer is the activator's queue for a deployment without room.
type Buffer struct {
	// Capacity is the most requests waiting at once; more get 429.
	//
	// Bounds: [0, MaxBufferCapacity] = [0, 1000000]. Zero turns buffering
	// off. Each waiting request holds a goroutine, a connection and its
	// body in memory: a million is already gigabytes, and no replica set
	// drains more within a timeout.
	Capacity int `json:"capacity"`
	// Timeout is how long a request may wait; past it, 503.
	//
	// Bounds: [10ms, 1h]. A cold start (loading weights) takes minutes,
	// so an hour covers the slowest; clients and proxies give up long
	// before, and a longer wait only holds buffer slots (87600h would
	// hold them for ten years).
	Timeout Duration `json:"timeout"`
}

// Bounds of the spec's fields; see the fields' doc comments for why.
const (
	MaxReplicas          = 1024
	MinTargetConcurrency = 0.01
	MaxTargetConcurrency = 100000
	MinTTFTSLO           = 10 * time.Millisecond
	MaxTTFTSLO           = time.Hour
	MinWindow            = time.Second
	MaxWindow            = time.Hour
	MaxIdleDelay         = 24 * time.Hour
	MaxBufferCapacity    = 1000000
	MinBufferTimeout     = 10 * time.Millisecond
	MaxBufferTimeout     = time.Hour
)

// Default is the spec of a model pushed without a stoke.yaml.
func Default() Spec {
	return Spec{
		Replicas:          Replicas{Min: 0, Max: 4, Sleeping: 4},
		TargetConcurrency: 8,
		TTFTSLO:           Duration(800 * time.Millisecond),
		Window:            Duration(60 * time.Second),
		IdleDelay:         Duration(30 * time.Second),
		Buffer:            Buffer{Capacity: 1000, Timeout: Duration(60 * time.Second)},
		Forecast:          Forecast{Predictive: true, Period: Duration(24 * time.Hour), Bucket: Duration(time.Minute)},
		Rollout:           Rollout{Eval: Eval{Metric: EvalExactMatch, MaxTokens: DefaultEvalTokens, Timeout: Duration(10 * time.Minute)}},
		Speculative:       true,
	}
}

// unset marks a field whose default follows another field.
const unset = -1 << 31

// Parse reads a spec (stoke.yaml as JSON, as the manifest carries it) over
// the defaults; empty means the defaults. A field the spec does not know
// (as "replicaz", or "mn" in replicas) is an error naming it, so that a
// typo is not silently served with the default. The watcher and the admin
// API hand stoke.yaml over converted to JSON, so the check covers YAML
// too; ParseYAML reads a YAML document directly.
func Parse(raw json.RawMessage) (Spec, error) {
	s := Default()
	if len(raw) > 0 && string(raw) != "null" {
		s.Replicas.Sleeping = unset
		if err := json.Unmarshal(raw, &s); err != nil {
			return Spec{}, fmt.Errorf("deployment spec: %w", err)
		}
		if err := knownFields(raw, reflect.TypeFor[Spec](), ""); err != nil {
			return Spec{}, fmt.Errorf("deployment spec: %w", err)
		}
		if s.Replicas.Sleeping == unset {
			s.Replicas.Sleeping = s.Replicas.Max
		}
	}
	return s, s.Validate()
}

// ParseYAML reads a stoke.yaml document as Parse reads JSON: over the
// defaults, unknown fields refused (as yaml.v3's KnownFields would, with the
// field's path), every bound checked.
func ParseYAML(raw []byte) (Spec, error) {
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return Spec{}, fmt.Errorf("deployment spec: %w", err)
	}
	if doc == nil {
		return Parse(nil)
	}
	if _, ok := doc.(map[string]any); !ok {
		return Spec{}, fmt.Errorf("deployment spec: want a mapping, not %T", doc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return Spec{}, fmt.Errorf("deployment spec: %w", err)
	}
	return Parse(b)
}

// knownFields reports the first member of the JSON object raw (of Go type
// t, a struct) that t has no field for, naming it by its path from the top
// ("replicas.mn"). Names must match the json tags exactly: encoding/json
// would accept "Replicas" for "replicas" but no spec is written so.
func knownFields(raw json.RawMessage, t reflect.Type, path string) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil // not an object (json.Unmarshal into t has judged it)
	}
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		fields[name] = f.Type
	}
	names := make([]string, 0, len(obj))
	for name := range obj {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		ft, ok := fields[name]
		if !ok {
			return fmt.Errorf("%s%s: unknown field", path, name)
		}
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct:
			if err := knownFields(obj[name], ft, path+name+"."); err != nil {
				return err
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			var elems []json.RawMessage
			if json.Unmarshal(obj[name], &elems) != nil {
				continue // not an array (json.Unmarshal into t has judged it)
			}
			for i, e := range elems {
				if err := knownFields(e, ft.Elem(), fmt.Sprintf("%s%s[%d].", path, name, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Validate checks every field against its bounds (see the fields' doc
// comments); the error names the first bad one.
func (s Spec) Validate() error {
	r := s.Replicas
	switch {
	case r.Min < 0:
		return fieldErr("replicas.min", "%d is negative", r.Min)
	case r.Max < 1:
		return fieldErr("replicas.max", "%d must be at least 1", r.Max)
	case r.Max > MaxReplicas:
		return fieldErr("replicas.max", "%d exceeds the limit of %d", r.Max, MaxReplicas)
	case r.Max < r.Min:
		return fieldErr("replicas.max", "%d must be at least replicas.min %d", r.Max, r.Min)
	case r.Sleeping < 0:
		return fieldErr("replicas.sleeping", "%d is negative", r.Sleeping)
	case r.Sleeping > r.Max:
		return fieldErr("replicas.sleeping", "%d exceeds replicas.max %d", r.Sleeping, r.Max)
	case math.IsNaN(s.TargetConcurrency) || s.TargetConcurrency < MinTargetConcurrency || s.TargetConcurrency > MaxTargetConcurrency:
		return fieldErr("target_concurrency", "%v is outside [%v, %v]", s.TargetConcurrency, MinTargetConcurrency, float64(MaxTargetConcurrency))
	}
	for _, d := range []struct {
		field    string
		v        Duration
		min, max time.Duration
	}{
		{"ttft_slo", s.TTFTSLO, MinTTFTSLO, MaxTTFTSLO},
		{"window", s.Window, MinWindow, MaxWindow},
		{"idle_delay", s.IdleDelay, 0, MaxIdleDelay},
	} {
		if err := d.v.check(d.field, d.min, d.max); err != nil {
			return err
		}
	}
	for _, p := range []struct {
		field string
		v     float64
	}{{"price.input_per_1m", s.Price.InputPer1M}, {"price.output_per_1m", s.Price.OutputPer1M}, {"price.cached_input_per_1m", s.Price.CachedInputPer1M}} {
		if math.IsNaN(p.v) || p.v < 0 || p.v > MaxPricePer1M {
			return fieldErr(p.field, "%v is outside [0, %d]", p.v, MaxPricePer1M)
		}
	}
	if v := s.Cost.ReplicaHourlyUSD; math.IsNaN(v) || v < 0 || v > MaxReplicaHourlyUSD {
		return fieldErr("cost.replica_hourly_usd", "%v is outside [0, %d]", v, MaxReplicaHourlyUSD)
	}
	if err := s.Forecast.validate(); err != nil {
		return err
	}
	if err := s.Rollout.validate(); err != nil {
		return err
	}
	switch {
	case s.Buffer.Capacity < 0:
		return fieldErr("buffer.capacity", "%d is negative", s.Buffer.Capacity)
	case s.Buffer.Capacity > MaxBufferCapacity:
		return fieldErr("buffer.capacity", "%d exceeds the limit of %d", s.Buffer.Capacity, MaxBufferCapacity)
	}
	return s.Buffer.Timeout.check("buffer.timeout", MinBufferTimeout, MaxBufferTimeout)
}

func (r Rollout) validate() error {
	e := r.Eval
	maxRegression := 1.0
	switch e.Metric {
	case EvalExactMatch:
	case EvalLogLikelihood:
		maxRegression = MaxLogLikelihood
	default:
		return fieldErr("rollout.eval.metric", "%q is not %s or %s", e.Metric, EvalExactMatch, EvalLogLikelihood)
	}
	switch {
	case r.CanaryPercent < 0 || r.CanaryPercent > 100:
		return fieldErr("rollout.canary_percent", "%d is outside [0, 100]", r.CanaryPercent)
	case e.File != "" && (!fs.ValidPath(e.File) || e.File == "." || strings.Contains(e.File, "/")):
		return fieldErr("rollout.eval.file", "%q is not the name of a file in the pushed directory", e.File)
	case math.IsNaN(e.MaxRegression) || e.MaxRegression < 0 || e.MaxRegression > maxRegression:
		return fieldErr("rollout.eval.max_regression", "%v is outside [0, %v] for %s", e.MaxRegression, maxRegression, e.Metric)
	case e.MaxTokens < 1 || e.MaxTokens > MaxEvalTokens:
		return fieldErr("rollout.eval.max_tokens", "%d is outside [1, %d]", e.MaxTokens, MaxEvalTokens)
	}
	return e.Timeout.check("rollout.eval.timeout", MinEvalTimeout, MaxEvalTimeout)
}

// CheckNode checks the bound that depends on the node the spec is served
// on: a minimum of replicas no larger than its slots (a replica holds a
// slot), so that a minimum the node cannot hold is refused instead of
// retried forever. A maximum past the node's slots is allowed: the
// controller never asks for more replicas than the node has slots. It does
// not repeat Validate. slots < 1 means the node's slots are not known:
// nothing is checked.
func (s Spec) CheckNode(slots int) error {
	if slots >= 1 && s.Replicas.Min > slots {
		return fieldErr("replicas.min", "%d exceeds the node's %d slots", s.Replicas.Min, slots)
	}
	return nil
}

func fieldErr(field, format string, args ...any) error {
	return fmt.Errorf("deployment spec: %s: %s", field, fmt.Sprintf(format, args...))
}

// check reports d outside [min, max] as an error naming field.
func (d Duration) check(field string, min, max time.Duration) error {
	if v := time.Duration(d); v < min || v > max {
		return fieldErr(field, "%v is outside [%v, %v]", v, min, max)
	}
	return nil
}

// Duration is a time.Duration written as a Go duration string in JSON.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler; a bare number is seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var secs float64
		if err := json.Unmarshal(b, &secs); err != nil {
			return fmt.Errorf("duration %s: want a string like \"60s\" or seconds", b)
		}
		ns := secs * float64(time.Second)
		if math.IsNaN(ns) || ns >= math.MaxInt64 || ns <= math.MinInt64 {
			return fmt.Errorf("duration %s: out of range", b)
		}
		*d = Duration(ns)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}
