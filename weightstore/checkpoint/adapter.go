package checkpoint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// Adapter is an open PEFT LoRA adapter: its adapter_config.json parsed and
// checked, and its adapter_model.safetensors in memory. It implements
// model.AdapterSource.
type Adapter struct {
	name   string
	config model.AdapterConfig
	file   *safetensors.File
	digest string
}

// OpenAdapter reads the PEFT adapter directory dir: adapter_config.json
// (checked, r at most maxRank, 0 for no bound) and adapter_model.safetensors,
// read whole (adapters are small) so that its digest, sha256 over both
// files, identifies the content. A dir that does not exist gives an error
// wrapping fs.ErrNotExist; anything wrong with the files one wrapping
// model.ErrInvalidAdapter.
func OpenAdapter(dir string, maxRank int) (*Adapter, error) {
	fail := func(err error) (*Adapter, error) { return nil, fmt.Errorf("open LoRA adapter %s: %w", dir, err) }
	st, err := os.Stat(dir)
	switch {
	case err != nil:
		return fail(err)
	case !st.IsDir():
		return fail(fmt.Errorf("%w: not a directory", model.ErrInvalidAdapter))
	}
	config, err := os.ReadFile(filepath.Join(dir, AdapterConfigFile))
	if errors.Is(err, fs.ErrNotExist) {
		return fail(fmt.Errorf("%w: %s is missing (not a PEFT adapter directory)", model.ErrInvalidAdapter, AdapterConfigFile))
	}
	if err != nil {
		return fail(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, AdapterWeightsFile))
	if errors.Is(err, fs.ErrNotExist) {
		if _, binErr := os.Stat(filepath.Join(dir, "adapter_model.bin")); binErr == nil {
			return fail(fmt.Errorf("%w: %s is missing; adapter_model.bin (pickle) is not read: save the adapter with safe_serialization", model.ErrInvalidAdapter, AdapterWeightsFile))
		}
		return fail(fmt.Errorf("%w: %s is missing", model.ErrInvalidAdapter, AdapterWeightsFile))
	}
	if err != nil {
		return fail(err)
	}
	f, err := safetensors.FromBytes(filepath.Join(dir, AdapterWeightsFile), data)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", model.ErrInvalidAdapter, err))
	}
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, uint64(len(config)))
	h.Write(config)
	h.Write(data)
	return AdapterFromFiles(dir, config, f, "sha256:"+hex.EncodeToString(h.Sum(nil)), maxRank)
}

// AdapterFromFiles is an adapter whose files are already at hand (a bucket
// revision in memory): config is adapter_config.json, weights the open
// adapter_model.safetensors, which the adapter closes; digest identifies
// the content (a revision digest). name identifies it in errors.
func AdapterFromFiles(name string, config []byte, weights *safetensors.File, digest string, maxRank int) (*Adapter, error) {
	cfg, err := model.ParseAdapterConfig(config, maxRank)
	if err != nil {
		weights.Close()
		return nil, fmt.Errorf("open LoRA adapter %s: %w", name, err)
	}
	return &Adapter{name: name, config: cfg, file: weights, digest: digest}, nil
}

// Config is the parsed adapter_config.json.
func (a *Adapter) Config() model.AdapterConfig { return a.config }

// Digest identifies the adapter's content.
func (a *Adapter) Digest() string { return a.digest }

// Names lists the tensors of adapter_model.safetensors, sorted.
func (a *Adapter) Names() []string {
	var names []string
	for _, t := range a.file.Header().Tensors {
		names = append(names, t.Name)
	}
	slices.Sort(names)
	return names
}

// Lookup returns a view of a tensor, valid until Close.
func (a *Adapter) Lookup(name string) (model.Tensor, bool) {
	info, data, err := a.file.TensorData(name)
	if err != nil {
		return model.Tensor{}, false
	}
	return model.Tensor{DType: info.DType, Shape: info.Shape, Data: data, Source: AdapterWeightsFile}, true
}

// Close releases the weights file.
func (a *Adapter) Close() error { return a.file.Close() }

// Build checks the adapter against the base model's config and returns its
// weights in F32 (see model.NewAdapter), tagged with the digest; the
// Adapter may be closed afterwards.
func (a *Adapter) Build(base *model.Config, maxRank int) (*model.Adapter, error) {
	m, err := model.NewAdapter(base, a.config, a, maxRank)
	if err != nil {
		return nil, fmt.Errorf("LoRA adapter %s: %w", a.name, err)
	}
	m.Digest = a.digest
	return m, nil
}

// LoadAdapter reads the PEFT adapter directory dir and checks it against
// base: OpenAdapter, then Build.
func LoadAdapter(dir string, base *model.Config, maxRank int) (*model.Adapter, error) {
	a, err := OpenAdapter(dir, maxRank)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	return a.Build(base, maxRank)
}

// File names of a PEFT LoRA adapter directory.
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
)

// CheckAdapter checks a PEFT LoRA adapter, its adapter_config.json and the
// header of its adapter_model.safetensors, against the config.json of the
// base model it is to apply to (model.CheckAdapter: the engine's own
// checks, rank unbounded), and returns the adapter's dtype. It reads
// metadata only, so `stoke push` and the watcher check an adapter in a
// bucket with a few small reads.
func CheckAdapter(baseConfig, adapterConfig []byte, h *safetensors.Header) (dtype.DType, error) {
	cfg, err := model.ParseConfig(baseConfig)
	if err != nil {
		return dtype.Invalid, fmt.Errorf("base model: %w", err)
	}
	ac, err := model.ParseAdapterConfig(adapterConfig, 0)
	if err != nil {
		return dtype.Invalid, err
	}
	if err := model.CheckAdapter(&cfg, ac, headerSource{h}, 0); err != nil {
		return dtype.Invalid, err
	}
	return h.Tensors[0].DType, nil // CheckAdapter refuses an adapter without tensors
}

// headerSource is a safetensors header as a model.AdapterSource of
// tensors without data.
type headerSource struct{ h *safetensors.Header }

func (s headerSource) Lookup(name string) (model.Tensor, bool) {
	t, ok := s.h.Lookup(name)
	if !ok {
		return model.Tensor{}, false
	}
	return model.Tensor{DType: t.DType, Shape: t.Shape, Source: AdapterWeightsFile}, true
}

func (s headerSource) Names() []string {
	names := make([]string, len(s.h.Tensors))
	for i, t := range s.h.Tensors {
		names[i] = t.Name
	}
	return names
}
