package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Config is the subset of a Hugging Face Llama config.json that the forward
// pass depends on. Field names follow config.json so that a Config written
// with encoding/json is a valid config.json.
type Config struct {
	Architectures         []string            `json:"architectures,omitempty"`
	ModelType             string              `json:"model_type"`
	HiddenSize            int                 `json:"hidden_size"`
	IntermediateSize      int                 `json:"intermediate_size"`
	NumLayers             int                 `json:"num_hidden_layers"`
	NumHeads              int                 `json:"num_attention_heads"`
	NumKVHeads            int                 `json:"num_key_value_heads"`
	HeadDim               int                 `json:"head_dim"`
	VocabSize             int                 `json:"vocab_size"`
	MaxPositionEmbeddings int                 `json:"max_position_embeddings"`
	RMSNormEps            float64             `json:"rms_norm_eps"`
	RopeTheta             float64             `json:"rope_theta"`
	RopeScaling           *RopeScaling        `json:"rope_scaling,omitempty"`
	TieWordEmbeddings     bool                `json:"tie_word_embeddings"`
	HiddenAct             string              `json:"hidden_act"`
	BOSTokenID            *int                `json:"bos_token_id,omitempty"`
	EOSTokenID            TokenIDs            `json:"eos_token_id,omitempty"`
	TorchDType            string              `json:"torch_dtype,omitempty"`
	Quantization          *QuantizationConfig `json:"quantization_config,omitempty"`
}

// RopeScaling is config.json's rope_scaling; only the "llama3" type changes
// the frequencies.
type RopeScaling struct {
	RopeType                      string  `json:"rope_type,omitempty"`
	Type                          string  `json:"type,omitempty"`
	Factor                        float64 `json:"factor"`
	LowFreqFactor                 float64 `json:"low_freq_factor,omitempty"`
	HighFreqFactor                float64 `json:"high_freq_factor,omitempty"`
	OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings,omitempty"`
}

// Kind is the scaling type, whichever of the two keys HF used.
func (r *RopeScaling) Kind() string {
	if r.RopeType != "" {
		return r.RopeType
	}
	return r.Type
}

// QuantizationConfig is config.json's quantization_config for FP8
// checkpoints (HF fine-grained FP8 and per-tensor/per-channel variants).
type QuantizationConfig struct {
	QuantMethod      string `json:"quant_method"`
	Fmt              string `json:"fmt,omitempty"`
	ActivationScheme string `json:"activation_scheme,omitempty"`
	WeightBlockSize  []int  `json:"weight_block_size,omitempty"`
}

// TokenIDs is a token id field that config.json writes either as a number
// or as a list of numbers.
type TokenIDs []int

// UnmarshalJSON accepts a number, a list of numbers or null.
func (t *TokenIDs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*t = nil
		return nil
	}
	if len(b) > 0 && b[0] == '[' {
		var ids []int
		if err := json.Unmarshal(b, &ids); err != nil {
			return err
		}
		*t = ids
		return nil
	}
	var id int
	if err := json.Unmarshal(b, &id); err != nil {
		return err
	}
	*t = TokenIDs{id}
	return nil
}

// MarshalJSON writes a single id as a number and several as a list.
func (t TokenIDs) MarshalJSON() ([]byte, error) {
	if len(t) == 1 {
		return json.Marshal(t[0])
	}
	return json.Marshal([]int(t))
}

// ParseConfig decodes and validates a config.json.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return Config{}, fmt.Errorf("parse config.json: %w", err)
	}
	if c.NumKVHeads == 0 {
		c.NumKVHeads = c.NumHeads
	}
	if c.HeadDim == 0 && c.NumHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if c.HiddenAct == "" {
		c.HiddenAct = "silu"
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

// Validate reports the first field that makes c unusable.
func (c *Config) Validate() error {
	positive := []struct {
		field string
		v     int
	}{
		{"hidden_size", c.HiddenSize},
		{"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumLayers},
		{"num_attention_heads", c.NumHeads},
		{"num_key_value_heads", c.NumKVHeads},
		{"head_dim", c.HeadDim},
		{"vocab_size", c.VocabSize},
		{"max_position_embeddings", c.MaxPositionEmbeddings},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return fmt.Errorf("%s must be positive, got %d", p.field, p.v)
		}
	}
	switch {
	case c.ModelType != "" && c.ModelType != "llama":
		return fmt.Errorf("model_type %q is not supported (want llama)", c.ModelType)
	case c.NumHeads%c.NumKVHeads != 0:
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.NumHeads, c.NumKVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("head_dim %d must be even for rotary embeddings", c.HeadDim)
	case c.HiddenAct != "silu":
		return fmt.Errorf("hidden_act %q is not supported (want silu)", c.HiddenAct)
	case !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0):
		return fmt.Errorf("rms_norm_eps must be positive, got %v", c.RMSNormEps)
	case !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0):
		return fmt.Errorf("rope_theta must be positive, got %v", c.RopeTheta)
	}
	if r := c.RopeScaling; r != nil {
		switch r.Kind() {
		case "llama3":
			if !(r.Factor > 0) || !(r.LowFreqFactor > 0) || !(r.HighFreqFactor > r.LowFreqFactor) || r.OriginalMaxPositionEmbeddings <= 0 {
				return errors.New("rope_scaling: llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0")
			}
		case "default", "":
		default:
			return fmt.Errorf("rope_scaling type %q is not supported", r.Kind())
		}
	}
	if q := c.Quantization; q != nil {
		if q.QuantMethod != "fp8" {
			return fmt.Errorf("quantization_config.quant_method %q is not supported (want fp8)", q.QuantMethod)
		}
		if q.Fmt != "" && q.Fmt != "e4m3" {
			return fmt.Errorf("quantization_config.fmt %q is not supported (want e4m3)", q.Fmt)
		}
		if b := q.WeightBlockSize; b != nil && (len(b) != 2 || b[0] <= 0 || b[1] <= 0) {
			return fmt.Errorf("quantization_config.weight_block_size must be two positive sizes, got %v", b)
		}
	}
	for _, id := range c.EOSTokenID {
		if id < 0 || id >= c.VocabSize {
			return fmt.Errorf("eos_token_id %d is outside the vocabulary (%d)", id, c.VocabSize)
		}
	}
	if c.BOSTokenID != nil && (*c.BOSTokenID < 0 || *c.BOSTokenID >= c.VocabSize) {
		return fmt.Errorf("bos_token_id %d is outside the vocabulary (%d)", *c.BOSTokenID, c.VocabSize)
	}
	return nil
}

// NumParameters counts the model's weights, embeddings included once when
// they are tied to the output projection.
func (c *Config) NumParameters() int64 {
	d, f, v := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.VocabSize)
	q, kv := int64(c.NumHeads*c.HeadDim), int64(c.NumKVHeads*c.HeadDim)
	layer := 2*d + d*q + 2*d*kv + q*d + 3*d*f
	n := v*d + int64(c.NumLayers)*layer + d
	if !c.TieWordEmbeddings {
		n += v * d
	}
	return n
}

// InverseFrequencies returns the rotary frequency of each of the head's
// half-dimensions, with llama3 scaling applied: the one definition of RoPE
// the CPU model and the GPU executor both use.
func (c *Config) InverseFrequencies() []float64 {
	half := c.HeadDim / 2
	freqs := make([]float64, half)
	for i := range freqs {
		freqs[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
	}
	r := c.RopeScaling
	if r == nil || r.Kind() != "llama3" {
		return freqs
	}
	oldCtx := float64(r.OriginalMaxPositionEmbeddings)
	lowWavelen := oldCtx / r.LowFreqFactor
	highWavelen := oldCtx / r.HighFreqFactor
	for i, f := range freqs {
		wavelen := 2 * math.Pi / f
		switch {
		case wavelen < highWavelen:
		case wavelen > lowWavelen:
			freqs[i] = f / r.Factor
		default:
			smooth := (oldCtx/wavelen - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
			freqs[i] = (1-smooth)*f/r.Factor + smooth*f
		}
	}
	return freqs
}
