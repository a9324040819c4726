package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/fp8"
)

// DefaultBlock is the FP8 block size of Hugging Face's fine-grained FP8
// checkpoints.
const DefaultBlock = 128

// QuantizeOptions control FP8 quantisation of a checkpoint.
type QuantizeOptions struct {
	Block     int
	ShardSize int64
}

// Quantize writes an FP8 E4M3 copy of the checkpoint in inDir to outDir:
// every projection weight becomes F8_E4M3 with a block-wise
// weight_scale_inv, norms, embeddings and the output head keep their dtype,
// config.json gains a quantization_config, and the other files (tokenizer,
// generation config) are copied.
func Quantize(ctx context.Context, inDir, outDir string, opts QuantizeOptions) error {
	if opts.Block <= 0 {
		opts.Block = DefaultBlock
	}
	in, err := Open(inDir)
	if err != nil {
		return err
	}
	defer in.Close()
	if in.Config().Quantization != nil {
		return fmt.Errorf("quantize %s: the checkpoint is already quantised (%s)", inDir, in.Config().Quantization.QuantMethod)
	}
	var entries []Entry
	for _, name := range in.Names() {
		t, _ := in.Lookup(name)
		if !model.IsProjection(name) {
			entries = append(entries, Entry{Name: name, DType: t.DType, Shape: t.Shape, Bytes: func() ([]byte, error) { return t.Data, nil }})
			continue
		}
		if len(t.Shape) != 2 {
			return fmt.Errorf("quantize %s: tensor %s has shape %v, want 2 dimensions", inDir, name, t.Shape)
		}
		entries = append(entries, FP8Entries(name, t.Shape, opts.Block, func() ([]float32, error) {
			return dtype.ToFloat32(t.DType, t.Data)
		})...)
	}
	files, err := siblingFiles(inDir)
	if err != nil {
		return fmt.Errorf("quantize %s: %w", inDir, err)
	}
	raw, err := os.ReadFile(filepath.Join(inDir, ConfigFile))
	if err != nil {
		return fmt.Errorf("quantize %s: %w", inDir, err)
	}
	if files[ConfigFile], err = WithFP8Config(raw, opts.Block); err != nil {
		return fmt.Errorf("quantize %s: %w", inDir, err)
	}
	return Write(ctx, outDir, entries, WriteOptions{ShardSize: opts.ShardSize, Files: files})
}

// FP8Entries returns the two tensors that replace a float projection
// weight: the F8_E4M3 weight and its F32 weight_scale_inv of shape
// [ceil(rows/block), ceil(cols/block)]. The weights are read and quantised
// once, when the first of the two is written.
func FP8Entries(name string, shape []int, block int, weights func() ([]float32, error)) []Entry {
	rows, cols := shape[0], shape[1]
	var (
		once  sync.Once
		q     []byte
		scale []byte
		err   error
	)
	quantize := func() {
		var w []float32
		if w, err = weights(); err != nil {
			return
		}
		var s []float32
		if q, s, err = fp8.QuantizeBlocks(w, rows, cols, block); err != nil {
			return
		}
		scale, err = dtype.FromFloat32(dtype.F32, s)
	}
	scaleShape := []int{(rows + block - 1) / block, (cols + block - 1) / block}
	return []Entry{
		{Name: name, DType: dtype.F8E4M3, Shape: shape, Bytes: func() ([]byte, error) {
			once.Do(quantize)
			return q, err
		}},
		{Name: strings.TrimSuffix(name, ".weight") + ".weight_scale_inv", DType: dtype.F32, Shape: scaleShape, Bytes: func() ([]byte, error) {
			once.Do(quantize)
			return scale, err
		}},
	}
}

// WithFP8Config returns config.json with a fine-grained FP8
// quantization_config, keeping every other field as it was.
func WithFP8Config(configJSON []byte, block int) ([]byte, error) {
	var fields map[string]any
	if err := json.Unmarshal(configJSON, &fields); err != nil {
		return nil, fmt.Errorf("parse %s: %w", ConfigFile, err)
	}
	fields["quantization_config"] = model.QuantizationConfig{
		QuantMethod:      "fp8",
		Fmt:              "e4m3",
		ActivationScheme: "dynamic",
		WeightBlockSize:  []int{block, block},
	}
	return json.MarshalIndent(fields, "", "  ")
}

// siblingFiles reads the files of a checkpoint directory other than its
// weights: tokenizer files, generation config and the like.
func siblingFiles(dir string) (map[string][]byte, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasSuffix(name, ".safetensors") || name == IndexFile || name == ConfigFile {
			continue
		}
		if files[name], err = os.ReadFile(filepath.Join(dir, name)); err != nil {
			return nil, err
		}
	}
	return files, nil
}
