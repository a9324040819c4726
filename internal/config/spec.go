// Package config is the deployment spec: what a pushed stoke.yaml may say
// about how its model is served, with the defaults for what it leaves out.
package config

import (
	"encoding/json"
	"fmt"
	"time"
)

// Spec is a deployment's serving configuration. Durations are Go duration
// strings in JSON ("60s").
type Spec struct {
	Replicas Replicas `json:"replicas"`
	// TargetConcurrency is the in-flight requests one replica should
	// carry; the scaler sizes the deployment by it.
	TargetConcurrency float64 `json:"target_concurrency"`
	// TTFTSLO is the time to first token the scaler defends: when the p90
	// of requests' waits for a replica (in the activator's buffer, over
	// the window) exceeds it, the deployment gets one more replica. Compute
	// time is left out: more replicas on the same node cannot shorten it.
	TTFTSLO Duration `json:"ttft_slo"`
	// Window is the scaler's stable window: concurrency is averaged over
	// it (the panic window is a tenth of it), as Knative's
	// autoscaling.knative.dev/window.
	Window Duration `json:"window"`
	// IdleDelay is how long load must stay lower before replicas are
	// released (to sleep or to the warm pool).
	IdleDelay Duration `json:"idle_delay"`
	// Buffer bounds the requests waiting for a replica.
	Buffer Buffer `json:"buffer"`
}

// Replicas bounds a deployment's replica count.
type Replicas struct {
	Min int `json:"min"`
	Max int `json:"max"`
	// Sleeping is the most released replicas kept asleep (weights in
	// host memory, woken in tier T1) within the node's sleep budget; the
	// rest go back to the warm pool. It defaults to Max.
	Sleeping int `json:"sleeping"`
}

// Buffer is the activator's queue for a deployment without room.
type Buffer struct {
	// Capacity is the most requests waiting at once; more get 429.
	Capacity int `json:"capacity"`
	// Timeout is how long a request may wait; past it, 503.
	Timeout Duration `json:"timeout"`
}

// Default is the spec of a model pushed without a stoke.yaml.
func Default() Spec {
	return Spec{
		Replicas:          Replicas{Min: 0, Max: 4, Sleeping: 4},
		TargetConcurrency: 8,
		TTFTSLO:           Duration(800 * time.Millisecond),
		Window:            Duration(60 * time.Second),
		IdleDelay:         Duration(30 * time.Second),
		Buffer:            Buffer{Capacity: 1000, Timeout: Duration(60 * time.Second)},
	}
}

// unset marks a field whose default follows another field.
const unset = -1 << 31

// Parse reads a spec (stoke.yaml as JSON, as the manifest carries it) over
// the defaults; empty means the defaults.
func Parse(raw json.RawMessage) (Spec, error) {
	s := Default()
	if len(raw) > 0 && string(raw) != "null" {
		s.Replicas.Sleeping = unset
		if err := json.Unmarshal(raw, &s); err != nil {
			return Spec{}, fmt.Errorf("deployment spec: %w", err)
		}
		if s.Replicas.Sleeping == unset {
			s.Replicas.Sleeping = s.Replicas.Max
		}
	}
	return s, s.Validate()
}

// Validate checks every field; the error names the first bad one.
func (s Spec) Validate() error {
	switch {
	case s.Replicas.Min < 0:
		return fmt.Errorf("deployment spec: replicas.min %d is negative", s.Replicas.Min)
	case s.Replicas.Max < 1 || s.Replicas.Max < s.Replicas.Min:
		return fmt.Errorf("deployment spec: replicas.max %d must be at least 1 and at least replicas.min %d", s.Replicas.Max, s.Replicas.Min)
	case s.Replicas.Sleeping < 0:
		return fmt.Errorf("deployment spec: replicas.sleeping %d is negative", s.Replicas.Sleeping)
	case s.TargetConcurrency <= 0:
		return fmt.Errorf("deployment spec: target_concurrency %v must be positive", s.TargetConcurrency)
	case s.TTFTSLO <= 0:
		return fmt.Errorf("deployment spec: ttft_slo must be positive")
	case time.Duration(s.Window) < time.Second:
		return fmt.Errorf("deployment spec: window must be at least 1s")
	case s.IdleDelay < 0:
		return fmt.Errorf("deployment spec: idle_delay must not be negative")
	case s.Buffer.Capacity < 0:
		return fmt.Errorf("deployment spec: buffer.capacity %d is negative", s.Buffer.Capacity)
	case s.Buffer.Timeout <= 0:
		return fmt.Errorf("deployment spec: buffer.timeout must be positive")
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
		*d = Duration(secs * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}
