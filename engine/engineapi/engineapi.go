// Package engineapi holds the wire types of an engine runtime's admin API
// (/admin/load, /admin/state): what the engine's server answers and what
// the runtime manager that drives it reads. Both sides import this small
// package, so the control plane never links the engine's model code.
package engineapi

import (
	"strings"

	"github.com/stokehq/stoke/internal/tier"
)

// LoadRequest names the model /admin/load loads: a checkpoint directory on
// this node (Path), or a revision in a bucket (Source, Model, Revision).
type LoadRequest struct {
	// Path is a checkpoint directory on this node (a profile for the sim).
	Path string `json:"path,omitempty"`
	// Source is the bucket holding the model's prefix: s3://bucket[/prefix]
	// or file:///dir.
	Source string `json:"source,omitempty"`
	// Model is the model's name, its prefix in Source.
	Model string `json:"model,omitempty"`
	// Revision pins a revision digest; "" loads the current one.
	Revision string `json:"revision,omitempty"`
	// ServedModelName names the model in the API (default: the model's
	// name, or the directory's).
	ServedModelName string `json:"served_model_name,omitempty"`
}

// String names the request in logs and errors.
func (r LoadRequest) String() string {
	if r.Path != "" {
		return r.Path
	}
	s := strings.TrimSuffix(r.Source, "/") + "/" + r.Model
	if r.Revision != "" {
		s += "@" + r.Revision
	}
	return s
}

// LoadProgress is how far a load has come, shown in /admin/state.
type LoadProgress struct {
	// Request is what is being loaded.
	Request LoadRequest `json:"request"`
	// Revision is the digest being loaded, once known.
	Revision string `json:"revision,omitempty"`
	// Tier is where the bytes come from: tier.Cache the node cache,
	// tier.Bucket the bucket, tier.Local a directory on this node.
	Tier tier.Tier `json:"tier,omitempty"`
	// Bytes moved so far, of TotalBytes.
	Bytes      int64 `json:"bytes"`
	TotalBytes int64 `json:"total_bytes"`
	// GBps is the average rate so far in 10⁹ bytes per second.
	GBps           float64 `json:"gbps"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// Done is set once the load finished; Error when it failed.
	Done  bool   `json:"done"`
	Error string `json:"error,omitempty"`
}

// State is where the server's model is in its life.
type State string

// The server's states.
const (
	StateBlank    State = "blank"
	StateLoading  State = "loading"
	StateReady    State = "ready"
	StateSleeping State = "sleeping"
	StateDraining State = "draining"
)

// StateInfo is the GET /admin/state body.
type StateInfo struct {
	State   State  `json:"state"`
	Model   string `json:"model"`
	KV      KVInfo `json:"kv"`
	Running int    `json:"running"`
	Waiting int    `json:"waiting"`
	// Load is the current or last load's progress; nil before any load.
	Load *LoadProgress `json:"load,omitempty"`
}

// KVInfo is the KV pool part of StateInfo: its size in blocks (0 when no
// engine runs) and the fraction in use.
type KVInfo struct {
	Blocks int     `json:"blocks"`
	Usage  float64 `json:"usage"`
}

// PriorityHeader carries a request's scheduling priority from the
// platform's activator to the engine. It overrides the body's "priority"
// field: the activator sets it to the priority it decided (a client's
// clamped to the interactive band, a batch line's below it), so no client
// reaches the engine's scheduler with a priority of its own choosing.
const PriorityHeader = "X-Stoke-Priority"

// UsageTrailer is the HTTP trailer in which an engine sends a streamed
// answer's usage (an openai.Usage as JSON) after its last event, whether
// or not the client asked for stream_options.include_usage: the
// platform's activator counts every stream's tokens exactly (usage
// records, limits, budgets) from it and removes it from the answer.
const UsageTrailer = "Stoke-Usage"
