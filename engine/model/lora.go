package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/internal/dtype"
)

// File names of a PEFT LoRA adapter directory.
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
)

// ErrInvalidAdapter is wrapped by every error that says a LoRA adapter
// cannot be served on a base model: a config.json field PEFT writes that
// this engine does not implement, a tensor it does not expect, a shape that
// does not fit the base, a rank past the engine's limit. Callers tell bad
// adapters (the client's fault) from I/O failures with errors.Is.
var ErrInvalidAdapter = errors.New("invalid LoRA adapter")

func invalidAdapter(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidAdapter, fmt.Sprintf(format, args...))
}

// Projection indices: the linear layers of a block a LoRA adapter may
// target, in the order of [projections] and of Layer's fields.
const (
	projQ = iota
	projK
	projV
	projO
	projGate
	projUp
	projDown
	numProjections
)

// ProjectionModules are the PEFT module names of a Llama block's linear
// layers, the names target_modules lists.
func ProjectionModules() []string {
	out := make([]string, numProjections)
	for i, p := range projections {
		out[i] = p[strings.IndexByte(p, '.')+1:]
	}
	return out
}

// projectionShape is the [out, in] shape of projection p of c's blocks.
func (c *Config) projectionShape(p int) (out, in int) {
	d, f := c.HiddenSize, c.IntermediateSize
	q, kv := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	switch p {
	case projQ:
		return q, d
	case projK, projV:
		return kv, d
	case projO:
		return d, q
	case projGate, projUp:
		return f, d
	default:
		return d, f
	}
}

// TargetModules is adapter_config.json's target_modules: a list of module
// names (each matching a module whose name is it or ends in "."+it), the
// string "all-linear" (every linear layer but the output head), or any
// other string, a regular expression that must match a module's whole name
// ("model.layers.3.self_attn.q_proj"), as PEFT reads them.
type TargetModules struct {
	Names     []string
	AllLinear bool
	Regex     string
}

// UnmarshalJSON accepts a list of names or a string.
func (t *TargetModules) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	*t = TargetModules{}
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '[' {
		return json.Unmarshal(b, &t.Names)
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("target_modules must be a list of module names or a string: %w", err)
	}
	if s == "all-linear" {
		t.AllLinear = true
	} else {
		t.Regex = s
	}
	return nil
}

// MarshalJSON writes the form it was read from.
func (t TargetModules) MarshalJSON() ([]byte, error) {
	switch {
	case t.AllLinear:
		return json.Marshal("all-linear")
	case t.Regex != "":
		return json.Marshal(t.Regex)
	case t.Names == nil:
		return []byte("null"), nil
	}
	return json.Marshal(t.Names)
}

func (t TargetModules) empty() bool { return !t.AllLinear && t.Regex == "" && len(t.Names) == 0 }

// LayerList is a list of layer indices that config files write either as
// one number or as a list (PEFT's layers_to_transform).
type LayerList []int

// UnmarshalJSON accepts a number, a list of numbers or null.
func (l *LayerList) UnmarshalJSON(b []byte) error {
	var ids TokenIDs
	if err := ids.UnmarshalJSON(b); err != nil {
		return fmt.Errorf("layers_to_transform must be a layer index or a list of them: %w", err)
	}
	*l = LayerList(ids)
	return nil
}

// AdapterConfig is the part of a PEFT LoRA adapter_config.json that
// changes what the adapter computes. Fields PEFT writes that this engine
// does not implement (DoRA, modules_to_save, rank and alpha patterns,
// biases, layer replication) are read so that an adapter using them is
// refused rather than served wrong.
type AdapterConfig struct {
	PeftType string `json:"peft_type,omitempty"`
	TaskType string `json:"task_type,omitempty"`
	// BaseModel is the base the adapter was trained on, as PEFT recorded
	// it (informational: the shapes decide whether it fits).
	BaseModel string `json:"base_model_name_or_path,omitempty"`
	// R is the rank: lora_A is [r, in], lora_B [out, r].
	R int `json:"r"`
	// LoraAlpha scales the update by alpha/r (alpha/sqrt(r) with
	// UseRSLoRA); PEFT's default is 8.
	LoraAlpha     float64       `json:"lora_alpha"`
	TargetModules TargetModules `json:"target_modules"`
	UseRSLoRA     bool          `json:"use_rslora,omitempty"`
	// LayersToTransform, when set, limits the adapter to these blocks.
	LayersToTransform LayerList `json:"layers_to_transform,omitempty"`
	Bias              string    `json:"bias,omitempty"`
	FanInFanOut       bool      `json:"fan_in_fan_out,omitempty"`
	LoraDropout       float64   `json:"lora_dropout,omitempty"`

	UseDoRA          bool                       `json:"use_dora,omitempty"`
	ModulesToSave    []string                   `json:"modules_to_save,omitempty"`
	RankPattern      map[string]json.RawMessage `json:"rank_pattern,omitempty"`
	AlphaPattern     map[string]json.RawMessage `json:"alpha_pattern,omitempty"`
	LayerReplication json.RawMessage            `json:"layer_replication,omitempty"`
	LoraBias         bool                       `json:"lora_bias,omitempty"`
	TargetParameters []string                   `json:"target_parameters,omitempty"`
}

// defaultLoraAlpha is PEFT's LoraConfig default.
const defaultLoraAlpha = 8

// ParseAdapterConfig decodes an adapter_config.json and checks it (see
// AdapterConfig.Validate; maxRank 0 means no rank limit).
func ParseAdapterConfig(data []byte, maxRank int) (AdapterConfig, error) {
	var c AdapterConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return AdapterConfig{}, invalidAdapter("parse %s: %v", AdapterConfigFile, err)
	}
	var present map[string]json.RawMessage
	if err := json.Unmarshal(data, &present); err == nil {
		if _, ok := present["lora_alpha"]; !ok {
			c.LoraAlpha = defaultLoraAlpha
		}
	}
	if err := c.Validate(maxRank); err != nil {
		return AdapterConfig{}, err
	}
	return c, nil
}

// Validate reports the first field that makes the adapter one this engine
// cannot serve, or a rank past maxRank (0: no limit). The error wraps
// ErrInvalidAdapter and names the field.
func (c *AdapterConfig) Validate(maxRank int) error {
	switch {
	case c.PeftType != "" && !strings.EqualFold(c.PeftType, "LORA"):
		return invalidAdapter("%s: peft_type %q is not supported (want LORA)", AdapterConfigFile, c.PeftType)
	case c.R < 1:
		return invalidAdapter("%s: r must be positive, got %d", AdapterConfigFile, c.R)
	case maxRank > 0 && c.R > maxRank:
		return invalidAdapter("%s: r = %d exceeds the engine's maximum LoRA rank %d (--max-lora-rank)", AdapterConfigFile, c.R, maxRank)
	case !(c.LoraAlpha > 0) || math.IsInf(c.LoraAlpha, 0):
		return invalidAdapter("%s: lora_alpha must be positive, got %v", AdapterConfigFile, c.LoraAlpha)
	case c.TargetModules.empty():
		return invalidAdapter("%s: target_modules is empty: the adapter changes nothing", AdapterConfigFile)
	case c.UseDoRA:
		return invalidAdapter("%s: DoRA adapters (use_dora: true) are not supported", AdapterConfigFile)
	case len(c.ModulesToSave) > 0:
		return invalidAdapter("%s: modules_to_save %v is not supported: the adapter replaces whole modules, not low-rank updates", AdapterConfigFile, c.ModulesToSave)
	case c.Bias != "" && c.Bias != "none":
		return invalidAdapter("%s: bias %q is not supported (want \"none\")", AdapterConfigFile, c.Bias)
	case c.FanInFanOut:
		return invalidAdapter("%s: fan_in_fan_out: true is not supported (Llama's projections are not Conv1D)", AdapterConfigFile)
	case len(c.RankPattern) > 0:
		return invalidAdapter("%s: rank_pattern is not supported: every module must have rank r", AdapterConfigFile)
	case len(c.AlphaPattern) > 0:
		return invalidAdapter("%s: alpha_pattern is not supported: every module must use lora_alpha", AdapterConfigFile)
	case len(c.LayerReplication) > 0 && string(c.LayerReplication) != "null":
		return invalidAdapter("%s: layer_replication is not supported", AdapterConfigFile)
	case c.LoraBias:
		return invalidAdapter("%s: lora_bias: true is not supported", AdapterConfigFile)
	case len(c.TargetParameters) > 0:
		return invalidAdapter("%s: target_parameters is not supported", AdapterConfigFile)
	}
	if c.TargetModules.Regex != "" {
		if _, err := c.targetRegex(); err != nil {
			return err
		}
	}
	modules := ProjectionModules()
	for _, name := range c.TargetModules.Names {
		ok := false
		for _, p := range projections {
			ok = ok || matchesModule(LayerPrefix(0)+p, name)
		}
		if !ok {
			return invalidAdapter("%s: target module %q is not a linear projection of a Llama block (want some of %s)",
				AdapterConfigFile, name, strings.Join(modules, ", "))
		}
	}
	return nil
}

// Scale is the factor of the low-rank update: lora_alpha/r, or
// lora_alpha/sqrt(r) for rank-stabilised LoRA.
func (c *AdapterConfig) Scale() float32 {
	if c.UseRSLoRA {
		return float32(c.LoraAlpha / math.Sqrt(float64(c.R)))
	}
	return float32(c.LoraAlpha / float64(c.R))
}

func (c *AdapterConfig) targetRegex() (*regexp.Regexp, error) {
	re, err := regexp.Compile(`^(?:` + c.TargetModules.Regex + `)$`)
	if err != nil {
		return nil, invalidAdapter("%s: target_modules %q is not a regular expression this engine reads: %v", AdapterConfigFile, c.TargetModules.Regex, err)
	}
	return re, nil
}

// matchesModule is PEFT's test of a target module name against a module's
// full name.
func matchesModule(key, target string) bool {
	return key == target || strings.HasSuffix(key, "."+target)
}

// targets reports, for every block and projection, whether the config
// lets the adapter change it.
func (c *AdapterConfig) targets(layers int) ([][numProjections]bool, error) {
	var re *regexp.Regexp
	if c.TargetModules.Regex != "" {
		var err error
		if re, err = c.targetRegex(); err != nil {
			return nil, err
		}
	}
	for _, l := range c.LayersToTransform {
		if l < 0 || l >= layers {
			return nil, invalidAdapter("%s: layers_to_transform names layer %d, but the base model has %d", AdapterConfigFile, l, layers)
		}
	}
	out := make([][numProjections]bool, layers)
	for l := range out {
		if len(c.LayersToTransform) > 0 && !slices.Contains(c.LayersToTransform, l) {
			continue
		}
		for p, name := range projections {
			key := LayerPrefix(l) + name
			switch {
			case c.TargetModules.AllLinear:
				out[l][p] = true
			case re != nil:
				out[l][p] = re.MatchString(key)
			default:
				for _, t := range c.TargetModules.Names {
					out[l][p] = out[l][p] || matchesModule(key, t)
				}
			}
		}
	}
	return out, nil
}

// AdapterSource hands out an adapter's tensors by name and lists them all,
// so that tensors the adapter should not hold are refused too.
type AdapterSource interface {
	TensorSource
	Names() []string
}

// loraPair is one projection's low-rank update: A [r, in] and B [out, r],
// both F32.
type loraPair struct{ a, b *kernels.Matrix }

// LoRA stages: the groups of a block's projections that share an input,
// whose A matrices are applied as one product.
const (
	stageQKV    = iota // q_proj, k_proj, v_proj: the attention norm's output
	stageO             // o_proj: the attention's output
	stageGateUp        // gate_proj, up_proj: the MLP norm's output
	stageDown          // down_proj: SwiGLU's output
	numStages
)

// stageProjections lists each stage's projections, in the order addLoRA
// takes their outputs.
var stageProjections = [numStages][]int{{projQ, projK, projV}, {projO}, {projGate, projUp}, {projDown}}

// loraStage is an adapter's update of one stage of a block: the A of every
// projection it changes stacked into one matrix (the pairs' A are views of
// its rows), so that the stage's input is read once. A row's products
// are the same bits as with each A alone: each output is summed from its
// x row and W row only.
type loraStage struct {
	a     *kernels.Matrix // nil when the adapter changes none of the stage
	parts []loraPart
}

// loraPart is one projection of a stage: rows [off, off+r) of the
// stacked A, which of the stage's outputs it updates, and Bᵀ [r][out]: B
// transposed, so that a token's update is r rows of Bᵀ weighed by its
// x·Aᵀ (Pool.AddWeightedRows), added to its output in place.
type loraPart struct {
	out, off, r, n int
	bt             []float32
}

// Adapter is a LoRA adapter checked against one base model config, its
// weights in F32 so that applying it keeps the kernels' one-result-per-input
// promise whatever the base's dtype. It is immutable and may be shared by
// any number of batches and models of that config.
type Adapter struct {
	// Digest identifies the weights' content; whoever reads them sets it
	// (the engine salts the prefix cache with it).
	Digest string
	config AdapterConfig
	scale  float32
	// shape is the base config's geometry the adapter was checked against.
	shape  adapterShape
	layers [][numProjections]loraPair
	stages [][numStages]loraStage
	bytes  int64
}

// adapterShape is the part of a base config an adapter's shapes depend on.
type adapterShape struct{ hidden, intermediate, q, kv, layers int }

func shapeOf(c *Config) adapterShape {
	return adapterShape{c.HiddenSize, c.IntermediateSize, c.NumHeads * c.HeadDim, c.NumKVHeads * c.HeadDim, c.NumLayers}
}

// Config is the adapter's adapter_config.json.
func (a *Adapter) Config() AdapterConfig { return a.config }

// Rank is the adapter's r.
func (a *Adapter) Rank() int { return a.config.R }

// Scale is the factor applied to B·A (see AdapterConfig.Scale).
func (a *Adapter) Scale() float32 { return a.scale }

// Bytes is the memory the adapter's weights take.
func (a *Adapter) Bytes() int64 { return a.bytes }

// HasWeights is false for an adapter built from its config alone
// (AdapterFromConfig), which only the sim engine serves.
func (a *Adapter) HasWeights() bool { return a.layers != nil }

// Weights returns the F32 matrices A [r, in] and B [out, r] of module
// (a ProjectionModules name) in block layer, or nils when the adapter does
// not change it. B is a copy, rebuilt from the transposed layout the
// forward pass reads; it is meant for tests and merging.
func (a *Adapter) Weights(layer int, module string) (A, B *kernels.Matrix) {
	p := slices.Index(ProjectionModules(), module)
	if p < 0 || layer < 0 || layer >= len(a.layers) || a.layers[layer][p].a == nil {
		return nil, nil
	}
	for s, projs := range stageProjections {
		for _, part := range a.stages[layer][s].parts {
			if projs[part.out] != p {
				continue
			}
			b := make([]float32, part.n*part.r)
			for o := range part.n {
				for k := range part.r {
					b[o*part.r+k] = part.bt[k*part.n+o]
				}
			}
			return a.layers[layer][p].a, &kernels.Matrix{Rows: part.n, Cols: part.r, DType: dtype.F32, F32: b}
		}
	}
	return nil, nil
}

// AdapterFromConfig is an adapter with a config and no weights: what the
// sim engine, which computes nothing, serves. A model refuses to apply it.
func AdapterFromConfig(cfg AdapterConfig, maxRank int) (*Adapter, error) {
	if err := cfg.Validate(maxRank); err != nil {
		return nil, err
	}
	return &Adapter{config: cfg, scale: cfg.Scale()}, nil
}

// AdapterTensorName is the name PEFT saves a LoRA matrix under: which is
// "A" or "B", module a ProjectionModules name.
func AdapterTensorName(layer int, module, which string) string {
	p := slices.Index(ProjectionModules(), module)
	name := module
	if p >= 0 {
		name = projections[p]
	}
	return "base_model.model." + LayerPrefix(layer) + name + ".lora_" + which + ".weight"
}

// parseAdapterTensor splits a PEFT tensor name into its block, projection
// and matrix ("A" or "B"). It accepts names with or without the
// "base_model.model." prefix and the ".default" adapter infix.
func parseAdapterTensor(name string) (layer, proj int, which string, ok bool) {
	rest := strings.TrimPrefix(name, "base_model.model.")
	rest, ok = strings.CutPrefix(rest, "model.layers.")
	if !ok {
		return 0, 0, "", false
	}
	dot := strings.IndexByte(rest, '.')
	if dot < 1 {
		return 0, 0, "", false
	}
	layer, err := strconv.Atoi(rest[:dot])
	if err != nil || layer < 0 || strconv.Itoa(layer) != rest[:dot] {
		return 0, 0, "", false
	}
	rest = rest[dot+1:]
	for p, proj := range projections {
		tail, found := strings.CutPrefix(rest, proj+".")
		if !found {
			continue
		}
		switch tail {
		case "lora_A.weight", "lora_A.default.weight":
			return layer, p, "A", true
		case "lora_B.weight", "lora_B.default.weight":
			return layer, p, "B", true
		}
		return 0, 0, "", false
	}
	return 0, 0, "", false
}

// NewAdapter checks an adapter against the base model config: every tensor
// src holds must be the lora_A or lora_B of a projection the config targets,
// in a block the base has, in pairs, with shapes [r, in] and [out, r] that
// fit the base, in F32, F16 or BF16. The weights are copied into F32, so src
// may be closed afterwards. maxRank bounds r (0: no bound). Every refusal
// wraps ErrInvalidAdapter and names the tensor or field.
func NewAdapter(base *Config, cfg AdapterConfig, src AdapterSource, maxRank int) (*Adapter, error) {
	return buildAdapter(base, cfg, src, maxRank, true)
}

// CheckAdapter makes NewAdapter's checks from the tensors' names, dtypes
// and shapes alone (src's tensors need no data), so an adapter in a bucket
// can be checked from its safetensors header before anything loads it.
func CheckAdapter(base *Config, cfg AdapterConfig, src AdapterSource, maxRank int) error {
	_, err := buildAdapter(base, cfg, src, maxRank, false)
	return err
}

// buildAdapter is NewAdapter, copying the weights only when load is set
// (and returning no adapter otherwise).
func buildAdapter(base *Config, cfg AdapterConfig, src AdapterSource, maxRank int, load bool) (*Adapter, error) {
	if err := cfg.Validate(maxRank); err != nil {
		return nil, err
	}
	targets, err := cfg.targets(base.NumLayers)
	if err != nil {
		return nil, err
	}
	a := &Adapter{config: cfg, scale: cfg.Scale(), shape: shapeOf(base), layers: make([][numProjections]loraPair, base.NumLayers)}
	names := src.Names()
	slices.Sort(names)
	for _, name := range names {
		layer, p, which, ok := parseAdapterTensor(name)
		if !ok {
			return nil, invalidAdapter("tensor %s is not the lora_A or lora_B weight of a Llama projection (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)", name)
		}
		if layer >= base.NumLayers {
			return nil, invalidAdapter("tensor %s is for layer %d, but the base model has %d layers", name, layer, base.NumLayers)
		}
		if !targets[layer][p] {
			return nil, invalidAdapter("tensor %s is for a module that target_modules (or layers_to_transform) of %s does not name", name, AdapterConfigFile)
		}
		t, _ := src.Lookup(name)
		out, in := base.projectionShape(p)
		want := []int{cfg.R, in}
		if which == "B" {
			want = []int{out, cfg.R}
		}
		if !slices.Equal(t.Shape, want) {
			return nil, invalidAdapter("tensor %s has shape %v, want %v (r = %d of %s, and the base's %s of %d×%d)",
				name, t.Shape, want, cfg.R, AdapterConfigFile, projections[p], out, in)
		}
		switch t.DType {
		case dtype.F32, dtype.F16, dtype.BF16:
		default:
			return nil, invalidAdapter("tensor %s has dtype %v, want F32, F16 or BF16", name, t.DType)
		}
		m := &kernels.Matrix{Rows: want[0], Cols: want[1], DType: dtype.F32}
		if load {
			v, err := toFloat32(t)
			if err != nil {
				return nil, invalidAdapter("tensor %s: %v", name, err)
			}
			m.F32 = v
			a.bytes += int64(len(v)) * 4
		}
		slot := &a.layers[layer][p].a
		if which == "B" {
			slot = &a.layers[layer][p].b
		}
		if *slot != nil {
			return nil, invalidAdapter("tensor %s: the adapter holds lora_%s of layer %d's %s twice", name, which, layer, projections[p])
		}
		*slot = m
	}
	pairs := 0
	for l := range a.layers {
		for p := range a.layers[l] {
			pair := a.layers[l][p]
			switch {
			case pair.a != nil && pair.b != nil:
				pairs++
			case pair.a != nil:
				return nil, invalidAdapter("tensor %s is missing (its lora_A is present)", AdapterTensorName(l, ProjectionModules()[p], "B"))
			case pair.b != nil:
				return nil, invalidAdapter("tensor %s is missing (its lora_B is present)", AdapterTensorName(l, ProjectionModules()[p], "A"))
			}
		}
	}
	if pairs == 0 {
		return nil, invalidAdapter("the adapter holds no lora_A/lora_B weights")
	}
	if !load {
		return nil, nil
	}
	a.stack()
	return a, nil
}

// stack builds the stages: the A matrices of each stage's projections are
// copied into one, and the pairs' A re-pointed at its rows.
func (a *Adapter) stack() {
	a.stages = make([][numStages]loraStage, len(a.layers))
	for l := range a.layers {
		for s, projs := range stageProjections {
			st := &a.stages[l][s]
			rows, cols := 0, 0
			for _, p := range projs {
				if pair := a.layers[l][p]; pair.a != nil {
					rows, cols = rows+pair.a.Rows, pair.a.Cols
				}
			}
			if rows == 0 {
				continue
			}
			stacked := make([]float32, 0, rows*cols)
			for i, p := range projs {
				pair := &a.layers[l][p]
				if pair.a == nil {
					continue
				}
				off, r, n := len(stacked)/cols, pair.a.Rows, pair.b.Rows
				stacked = append(stacked, pair.a.F32...)
				pair.a = &kernels.Matrix{Rows: r, Cols: cols, DType: dtype.F32, F32: stacked[off*cols : (off+r)*cols]}
				bt := make([]float32, r*n)
				for o := range n {
					for k := range r {
						bt[k*n+o] = pair.b.F32[o*r+k]
					}
				}
				pair.b = nil // Weights rebuilds it from bt
				st.parts = append(st.parts, loraPart{out: i, off: off, r: r, n: n, bt: bt})
			}
			st.a = &kernels.Matrix{Rows: rows, Cols: cols, DType: dtype.F32, F32: stacked}
		}
	}
}

// fits reports why a cannot apply to a model of config c, or nil.
func (a *Adapter) fits(c *Config) error {
	if !a.HasWeights() {
		return errors.New("the adapter has no weights (it was built from its config alone)")
	}
	if a.shape != shapeOf(c) {
		return fmt.Errorf("the adapter was checked against another base (%+v), not this model (%+v)", a.shape, shapeOf(c))
	}
	return nil
}

// RandomAdapterSource returns the tensors of a random LoRA adapter of rank
// r for base, in F32 under PEFT's names, for the projections modules names
// (nil: all of them) in every block, deterministic for seed: every weight
// of A and B drawn from N(0, std²). It gives tests and benchmarks adapters
// without files.
func RandomAdapterSource(base Config, r int, modules []string, seed uint64, std float64) AdapterSource {
	if modules == nil {
		modules = ProjectionModules()
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	src := memorySource{}
	for l := range base.NumLayers {
		for p, module := range ProjectionModules() {
			if !slices.Contains(modules, module) {
				continue
			}
			out, in := base.projectionShape(p)
			for _, m := range []struct {
				which string
				shape []int
			}{{"A", []int{r, in}}, {"B", []int{out, r}}} {
				v := make([]float32, m.shape[0]*m.shape[1])
				for i := range v {
					v[i] = float32(rng.NormFloat64() * std)
				}
				b, _ := dtype.FromFloat32(dtype.F32, v)
				src[AdapterTensorName(l, module, m.which)] = Tensor{DType: dtype.F32, Shape: m.shape, Data: b, Source: "memory"}
			}
		}
	}
	return src
}

// Names lists the tensors of a memory source.
func (m memorySource) Names() []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// AdapterStd is the standard deviation of A's and B's random weights that
// makes the entries of scale·B·A about target in standard deviation:
// each is a sum of r products of two N(0, std²) draws.
func AdapterStd(cfg AdapterConfig, target float64) float64 {
	return math.Sqrt(target / (float64(cfg.Scale()) * math.Sqrt(float64(cfg.R))))
}

// loraPlan is how one forward call applies adapters: the batch's tokens
// grouped by the adapter of their sequence (Punica's segments), planned
// once and used by every stage of every layer.
type loraPlan struct {
	groups []loraGroup
}

// loraGroup is the tokens (indices into the batch) whose sequences use
// adapter a; contiguous is set when they are one run of the batch, which
// the products then read in place. x, t, tp and u are its working memory:
// the gathered inputs, x·Aᵀ of the stacked A, one part of it, and that
// part's (x·Aᵀ)·Bᵀ.
type loraGroup struct {
	a          *Adapter
	rows       []int
	contiguous bool
	// runs are the group's runs of consecutive batch rows: its rows
	// [j, j+n) are batch rows [row, row+n).
	runs []loraRun
	x, t []float32
}

type loraRun struct{ j, row, n int }

// plan groups b's tokens by adapter; a batch without adapters plans no
// group, and the forward pass is then the base model's alone.
func (p *loraPlan) plan(b *Batch) {
	for i := range p.groups {
		p.groups[i].rows = p.groups[i].rows[:0]
	}
	p.groups = p.groups[:0]
	if len(b.Adapters) == 0 {
		return
	}
	for i, s := range b.Seqs {
		a := b.Adapters[s]
		if a == nil {
			continue
		}
		g := slices.IndexFunc(p.groups, func(g loraGroup) bool { return g.a == a })
		if g < 0 {
			g = len(p.groups)
			if g < cap(p.groups) {
				p.groups = p.groups[:g+1]
				p.groups[g].a = a
			} else {
				p.groups = append(p.groups, loraGroup{a: a})
			}
		}
		p.groups[g].rows = append(p.groups[g].rows, i)
	}
	for i := range p.groups {
		g := &p.groups[i]
		g.contiguous = g.rows[len(g.rows)-1]-g.rows[0] == len(g.rows)-1
		g.runs = g.runs[:0]
		for j, row := range g.rows {
			if n := len(g.runs); n > 0 && g.runs[n-1].row+g.runs[n-1].n == row {
				g.runs[n-1].n++
				continue
			}
			g.runs = append(g.runs, loraRun{j: j, row: row, n: 1})
		}
	}
}

// validateAdapters checks b.Adapters against the model's config.
func (b *Batch) validateAdapters(c *Config) error {
	if len(b.Adapters) == 0 {
		return nil
	}
	if len(b.Adapters) != len(b.BlockTables) {
		return fmt.Errorf("batch: %d adapters for %d sequences", len(b.Adapters), len(b.BlockTables))
	}
	for s, a := range b.Adapters {
		if a == nil {
			continue
		}
		if err := a.fits(c); err != nil {
			return fmt.Errorf("batch: adapter of sequence %d: %w", s, err)
		}
	}
	return nil
}

// addLoRA applies stage of layer l: for every group of the plan whose
// adapter changes a projection of the stage, it adds scale·(x·Aᵀ)·Bᵀ to
// the group's rows of that projection's output (outs, in the order of
// stageProjections), x being the same rows of in, the stage's input. Each
// row's update is computed from that row alone, in one order (the pool's
// MatMul, Scale and AddWeightedRows), so it is the same bits whatever else
// is in the batch; the groups, which write disjoint rows, run in parallel.
func (m *Model) addLoRA(l, stage int, in []float32, outs ...[]float32) {
	groups := m.lora.groups
	m.pool.Parallel(len(groups), 1, func(lo, hi int) {
		for gi := lo; gi < hi; gi++ {
			m.addGroupLoRA(&groups[gi], l, stage, in, outs)
		}
	})
}

func (m *Model) addGroupLoRA(g *loraGroup, l, stage int, in []float32, outs [][]float32) {
	st := &g.a.stages[l][stage]
	if st.a == nil {
		return
	}
	k, nIn, stacked := len(g.rows), st.a.Cols, st.a.Rows
	var x []float32
	if g.contiguous {
		x = in[g.rows[0]*nIn : (g.rows[0]+k)*nIn]
	} else {
		g.x = grow(g.x, k*nIn)
		for j, row := range g.rows {
			copy(g.x[j*nIn:(j+1)*nIn], in[row*nIn:(row+1)*nIn])
		}
		x = g.x
	}
	g.t = grow(g.t, k*stacked)
	m.pool.MatMul(g.t, x, k, st.a)
	m.pool.Scale(g.t, g.a.scale)
	for _, part := range st.parts {
		out := outs[part.out]
		for _, run := range g.runs {
			m.pool.AddWeightedRows(out[run.row*part.n:], part.n, g.t[run.j*stacked+part.off:], stacked, run.n, part.bt, part.n, part.r, part.n)
		}
	}
}
