// Package sim is the latency model behind `stoke engine --sim`: it stands in
// for the forward pass so the real scheduler, KV allocator, prefix cache,
// server and metrics run at GPU-like speeds on a machine without a GPU.
//
// The engine loop asks a Profile how long each scheduler step would take on
// the profiled GPU (StepTime) and sleeps for it, or advances a virtual clock
// in tests; Word supplies readable, deterministic text for the tokens the
// simulated model "generates".
//
// # Step time model
//
// A scheduler step that computes P prefill tokens and D decode sequences whose
// attention reads C tokens of KV cache in total takes
//
//	StepOverhead + P*PrefillPerToken + D*DecodePerSeq + C*DecodePerContextToken
//
// StepOverhead is the fixed cost of any step: streaming the weights from HBM
// once (decode is memory-bound), kernel launches, scheduling and sampling.
// PrefillPerToken is the compute-bound cost of one prompt token.
// DecodePerSeq is the marginal cost of one more sequence in the decode batch
// (activations, logits, sampling). DecodePerContextToken is the cost of
// reading one token's K and V from HBM during attention. Every coefficient
// is positive, so the step time grows with batch size and context length.
// The form is linear on purpose: it is cheap, monotone, and fits published
// single-stream TPOT, long-prompt TTFT and batch-64 throughput within a few
// tens of percent; it does not model the roofline crossover where large
// prefill chunks hide the weight read.
//
// # Profile files
//
// Profiles are YAML (or JSON, chosen by a .json extension) with the keys
// name, model, hardware, sources, step_overhead, prefill_per_token,
// decode_per_seq, decode_per_context_token (Go durations with a unit, such
// as "5.5ms", "22us", "50ns"), kv_capacity_tokens, max_num_seqs,
// max_model_len and vocab_size. Every key is required; unknown keys are
// errors. The embedded profiles carry their derivations as comments.
package sim

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

//go:embed profiles/*.yaml
var embedded embed.FS

// Profile describes one model served on one GPU class: the coefficients of
// the step time model and the capacity limits the engine enforces.
type Profile struct {
	// Name identifies the profile, e.g. "llama-3.1-8b-fp8-h100".
	Name string
	// Model is the served model name clients put in requests.
	Model string
	// Hardware describes the GPUs the numbers are for.
	Hardware string
	// Accelerators is how many GPUs one replica of the profile holds (its
	// tensor-parallel degree); 1 when the file leaves it out.
	Accelerators int
	// Sources says where each number comes from: published figures quoted
	// with their titles and addresses, and derivations marked as such.
	Sources []string

	// StepOverhead is the fixed cost of every non-empty step.
	StepOverhead time.Duration
	// PrefillPerToken is the cost of one prompt token computed in a step.
	PrefillPerToken time.Duration
	// DecodePerSeq is the cost of one sequence in a step's decode batch.
	DecodePerSeq time.Duration
	// DecodePerContextToken is the cost of one KV token read by attention.
	DecodePerContextToken time.Duration

	// KVCapacityTokens is the KV cache size in tokens left after weights.
	KVCapacityTokens int
	// MaxNumSeqs is the most sequences one step may hold.
	MaxNumSeqs int
	// MaxModelLen is the longest context (prompt plus output) in tokens.
	MaxModelLen int
	// VocabSize is the model's vocabulary size.
	VocabSize int
}

// StepTime returns how long one scheduler step takes on the profiled
// hardware when it computes prefillTokens prompt tokens and decodeSeqs decode
// sequences whose attention reads contextTokens KV tokens in total (the sum
// of the decoding sequences' context lengths; a caller may add the cached
// prefix that prefill chunks attend to, charged at the same rate). Negative
// arguments count as zero; a step with no work takes no time. The result
// saturates instead of overflowing.
func (p Profile) StepTime(prefillTokens, decodeSeqs, contextTokens int) time.Duration {
	prefill := max(prefillTokens, 0)
	decode := max(decodeSeqs, 0)
	context := max(contextTokens, 0)
	if prefill == 0 && decode == 0 && context == 0 {
		return 0
	}
	ns := float64(p.StepOverhead) +
		float64(prefill)*float64(p.PrefillPerToken) +
		float64(decode)*float64(p.DecodePerSeq) +
		float64(context)*float64(p.DecodePerContextToken)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// Validate checks every field of p and returns one error naming each field
// that is empty or out of range, or nil.
func (p Profile) Validate() error {
	return joinProblems(p.problems())
}

// problem is one bad field of a profile.
type problem struct{ field, msg string }

func (p Profile) problems() []problem {
	var out []problem
	bad := func(field, format string, args ...any) {
		out = append(out, problem{field, fmt.Sprintf(format, args...)})
	}
	for _, f := range []struct{ name, value string }{
		{"name", p.Name}, {"model", p.Model}, {"hardware", p.Hardware},
	} {
		if strings.TrimSpace(f.value) == "" {
			bad(f.name, "must not be empty")
		}
	}
	if len(p.Sources) == 0 {
		bad("sources", "must list at least one source for the numbers")
	}
	for i, s := range p.Sources {
		if strings.TrimSpace(s) == "" {
			bad("sources", "entry %d is empty", i)
		}
	}
	for _, f := range []struct {
		name  string
		value time.Duration
	}{
		{"step_overhead", p.StepOverhead},
		{"prefill_per_token", p.PrefillPerToken},
		{"decode_per_seq", p.DecodePerSeq},
		{"decode_per_context_token", p.DecodePerContextToken},
	} {
		if f.value <= 0 {
			bad(f.name, "must be a positive duration, got %v", f.value)
		}
	}
	for _, f := range []struct {
		name  string
		value int
	}{
		{"kv_capacity_tokens", p.KVCapacityTokens},
		{"max_num_seqs", p.MaxNumSeqs},
		{"max_model_len", p.MaxModelLen},
		{"vocab_size", p.VocabSize},
		{"accelerators", p.Accelerators},
	} {
		if f.value <= 0 {
			bad(f.name, "must be positive, got %d", f.value)
		}
	}
	if p.KVCapacityTokens > 0 && p.MaxModelLen > p.KVCapacityTokens {
		bad("kv_capacity_tokens", "%d is less than max_model_len %d: one full-length request would not fit",
			p.KVCapacityTokens, p.MaxModelLen)
	}
	return out
}

// joinProblems makes one error listing every problem, or nil.
func joinProblems(ps []problem) error {
	if len(ps) == 0 {
		return nil
	}
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = "field " + p.field + ": " + p.msg
	}
	return errors.New(strings.Join(parts, "; "))
}

// Profiles returns the names of the embedded profiles, sorted.
func Profiles() []string {
	entries, err := fs.ReadDir(embedded, "profiles")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".yaml"); ok && !e.IsDir() {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// LoadProfile returns the embedded profile called nameOrPath, or else reads
// the profile file at that path (JSON when it ends in .json, YAML otherwise),
// and validates it. Errors name the profile and every bad field.
func LoadProfile(nameOrPath string) (Profile, error) {
	if nameOrPath == "" {
		return Profile{}, fmt.Errorf("load sim profile: no name or path given (embedded: %s)",
			strings.Join(Profiles(), ", "))
	}
	if !strings.ContainsAny(nameOrPath, `/\`) {
		if data, err := embedded.ReadFile("profiles/" + nameOrPath + ".yaml"); err == nil {
			return parseProfile("embedded sim profile "+nameOrPath, data, false)
		}
		if _, err := os.Stat(nameOrPath); err != nil && !isProfileFileName(nameOrPath) {
			return Profile{}, fmt.Errorf("load sim profile %q: no embedded profile has that name (embedded: %s), and no such file",
				nameOrPath, strings.Join(Profiles(), ", "))
		}
	}
	data, err := os.ReadFile(nameOrPath)
	if err != nil {
		return Profile{}, fmt.Errorf("load sim profile: %w", err)
	}
	isJSON := strings.EqualFold(filepath.Ext(nameOrPath), ".json")
	return parseProfile("sim profile "+nameOrPath, data, isJSON)
}

// isProfileFileName reports whether name ends like a profile file.
func isProfileFileName(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// fileProfile is the on-disk form; pointers tell a missing key from a zero.
type fileProfile struct {
	Name                  *string   `json:"name" yaml:"name"`
	Model                 *string   `json:"model" yaml:"model"`
	Hardware              *string   `json:"hardware" yaml:"hardware"`
	Sources               *[]string `json:"sources" yaml:"sources"`
	StepOverhead          *string   `json:"step_overhead" yaml:"step_overhead"`
	PrefillPerToken       *string   `json:"prefill_per_token" yaml:"prefill_per_token"`
	DecodePerSeq          *string   `json:"decode_per_seq" yaml:"decode_per_seq"`
	DecodePerContextToken *string   `json:"decode_per_context_token" yaml:"decode_per_context_token"`
	KVCapacityTokens      *int      `json:"kv_capacity_tokens" yaml:"kv_capacity_tokens"`
	MaxNumSeqs            *int      `json:"max_num_seqs" yaml:"max_num_seqs"`
	MaxModelLen           *int      `json:"max_model_len" yaml:"max_model_len"`
	VocabSize             *int      `json:"vocab_size" yaml:"vocab_size"`
	Accelerators          *int      `json:"accelerators" yaml:"accelerators"`
}

func parseProfile(what string, data []byte, isJSON bool) (Profile, error) {
	var raw fileProfile
	var err error
	if isJSON {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err = dec.Decode(&raw)
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		err = dec.Decode(&raw)
	}
	if err != nil && !errors.Is(err, io.EOF) { // an empty file leaves every field missing
		return Profile{}, fmt.Errorf("parse %s: %w", what, err)
	}

	var p Profile
	var probs []problem
	reported := map[string]bool{}
	note := func(field, msg string) {
		probs = append(probs, problem{field, msg})
		reported[field] = true
	}
	str := func(field string, src *string, dst *string) {
		if src == nil {
			note(field, "missing")
			return
		}
		*dst = *src
	}
	dur := func(field string, src *string, dst *time.Duration) {
		if src == nil {
			note(field, "missing")
			return
		}
		d, err := time.ParseDuration(strings.TrimSpace(*src))
		if err != nil {
			note(field, fmt.Sprintf("want a duration with a unit such as \"5.5ms\" or \"50ns\", got %q", *src))
			return
		}
		*dst = d
	}
	num := func(field string, src *int, dst *int) {
		if src == nil {
			note(field, "missing")
			return
		}
		*dst = *src
	}
	str("name", raw.Name, &p.Name)
	str("model", raw.Model, &p.Model)
	str("hardware", raw.Hardware, &p.Hardware)
	if raw.Sources == nil {
		note("sources", "missing")
	} else {
		p.Sources = *raw.Sources
	}
	dur("step_overhead", raw.StepOverhead, &p.StepOverhead)
	dur("prefill_per_token", raw.PrefillPerToken, &p.PrefillPerToken)
	dur("decode_per_seq", raw.DecodePerSeq, &p.DecodePerSeq)
	dur("decode_per_context_token", raw.DecodePerContextToken, &p.DecodePerContextToken)
	num("kv_capacity_tokens", raw.KVCapacityTokens, &p.KVCapacityTokens)
	num("max_num_seqs", raw.MaxNumSeqs, &p.MaxNumSeqs)
	num("max_model_len", raw.MaxModelLen, &p.MaxModelLen)
	num("vocab_size", raw.VocabSize, &p.VocabSize)
	p.Accelerators = 1
	if raw.Accelerators != nil {
		p.Accelerators = *raw.Accelerators
	}
	for _, pr := range p.problems() {
		if !reported[pr.field] {
			probs = append(probs, pr)
		}
	}
	if err := joinProblems(probs); err != nil {
		return Profile{}, fmt.Errorf("%s: %w", what, err)
	}
	return p, nil
}
