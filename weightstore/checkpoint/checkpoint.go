// Package checkpoint reads and writes Hugging Face Llama checkpoint
// directories: config.json, one model.safetensors or shards listed in
// model.safetensors.index.json, and the tokenizer files beside them.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// File names of a Hugging Face checkpoint directory.
const (
	ConfigFile      = "config.json"
	SingleFile      = "model.safetensors"
	IndexFile       = "model.safetensors.index.json"
	TokenizerFile   = "tokenizer.json"
	TokenizerConfig = "tokenizer_config.json"
)

// Checkpoint is an open checkpoint directory whose tensors are mapped into
// memory. It implements model.TensorSource.
type Checkpoint struct {
	dir     string
	config  model.Config
	files   []*safetensors.File
	tensors map[string]located
}

type located struct {
	file *safetensors.File
	info safetensors.TensorInfo
}

// Index is the content of model.safetensors.index.json.
type Index struct {
	Metadata  map[string]any    `json:"metadata,omitempty"`
	WeightMap map[string]string `json:"weight_map"`
}

// Open reads config.json and maps every shard of the checkpoint in dir,
// checking that the index and the shards agree.
func Open(dir string) (*Checkpoint, error) {
	return open(dir, dirFiles(dir))
}

// OpenMemory opens a checkpoint whose files are already in memory (a
// revision the loader streamed into host-addressable device buffers): name
// identifies it in errors and files maps each file name to its content.
// Tensors are zero-copy views into the safetensors files' bytes, which the
// caller keeps alive until the checkpoint and its models are done.
func OpenMemory(name string, files map[string][]byte) (*Checkpoint, error) {
	return open(name, memFiles(files))
}

// fileSource is where a checkpoint's files come from; a missing file's
// error wraps fs.ErrNotExist.
type fileSource interface {
	readFile(name string) ([]byte, error)
	openShard(name string) (*safetensors.File, error)
}

type dirFiles string

func (d dirFiles) readFile(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(string(d), name))
}

func (d dirFiles) openShard(name string) (*safetensors.File, error) {
	return safetensors.Open(filepath.Join(string(d), name))
}

type memFiles map[string][]byte

func (m memFiles) readFile(name string) ([]byte, error) {
	data, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("read %s: %w", name, fs.ErrNotExist)
	}
	return data, nil
}

func (m memFiles) openShard(name string) (*safetensors.File, error) {
	data, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("open safetensors file %s: %w", name, fs.ErrNotExist)
	}
	return safetensors.FromBytes(name, data)
}

func open(dir string, src fileSource) (*Checkpoint, error) {
	raw, err := src.readFile(ConfigFile)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint %s: %w", dir, err)
	}
	cfg, err := model.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint %s: %w", dir, err)
	}
	c := &Checkpoint{dir: dir, config: cfg, tensors: map[string]located{}}
	if err := c.openShards(src); err != nil {
		c.Close()
		return nil, fmt.Errorf("open checkpoint %s: %w", dir, err)
	}
	return c, nil
}

func (c *Checkpoint) openShards(src fileSource) error {
	idx, err := readIndex(src)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f, err := src.openShard(SingleFile)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("neither %s nor %s is present", SingleFile, IndexFile)
			}
			return err
		}
		c.addFile(f)
		return nil
	case err != nil:
		return err
	}
	byFile := map[string]*safetensors.File{}
	for _, shard := range idx.Shards() {
		if filepath.Base(shard) != shard {
			return fmt.Errorf("%s names shard %q outside the checkpoint directory", IndexFile, shard)
		}
		f, err := src.openShard(shard)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("shard %s named in %s is missing", shard, IndexFile)
			}
			return err
		}
		byFile[shard] = f
		c.addFile(f)
	}
	for name, shard := range idx.WeightMap {
		l, ok := c.tensors[name]
		if !ok || l.file != byFile[shard] {
			return fmt.Errorf("%s maps tensor %s to %s, which does not hold it", IndexFile, name, shard)
		}
	}
	if len(c.tensors) != len(idx.WeightMap) {
		for name, l := range c.tensors {
			if _, ok := idx.WeightMap[name]; !ok {
				return fmt.Errorf("tensor %s in %s is not listed in %s", name, filepath.Base(l.file.Path()), IndexFile)
			}
		}
	}
	return nil
}

func (c *Checkpoint) addFile(f *safetensors.File) {
	c.files = append(c.files, f)
	for _, t := range f.Header().Tensors {
		c.tensors[t.Name] = located{file: f, info: t}
	}
}

// ReadIndex reads and checks dir's model.safetensors.index.json; the error
// wraps fs.ErrNotExist when the checkpoint is not sharded.
func ReadIndex(dir string) (*Index, error) { return readIndex(dirFiles(dir)) }

func readIndex(src fileSource) (*Index, error) {
	raw, err := src.readFile(IndexFile)
	if err != nil {
		return nil, err
	}
	var idx Index
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("parse %s: %w", IndexFile, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s has an empty weight_map", IndexFile)
	}
	return &idx, nil
}

// Shards lists the distinct shard files of the index, sorted.
func (idx *Index) Shards() []string {
	var out []string
	for _, f := range idx.WeightMap {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

// Dir is the checkpoint's directory.
func (c *Checkpoint) Dir() string { return c.dir }

// Config is the parsed config.json.
func (c *Checkpoint) Config() model.Config { return c.config }

// Names lists every tensor in the checkpoint, sorted.
func (c *Checkpoint) Names() []string {
	names := make([]string, 0, len(c.tensors))
	for n := range c.tensors {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Lookup returns a zero-copy view of a tensor.
func (c *Checkpoint) Lookup(name string) (model.Tensor, bool) {
	l, ok := c.tensors[name]
	if !ok {
		return model.Tensor{}, false
	}
	_, data, err := l.file.TensorData(name)
	if err != nil {
		return model.Tensor{}, false
	}
	return model.Tensor{DType: l.info.DType, Shape: l.info.Shape, Data: data, Source: filepath.Base(l.file.Path())}, true
}

// WeightDType is the dtype the checkpoint's weights are recorded as in
// manifests: see WeightDType.
func (c *Checkpoint) WeightDType() dtype.DType {
	headers := make([]*safetensors.Header, len(c.files))
	for i, f := range c.files {
		headers[i] = f.Header()
	}
	return WeightDType(headers...)
}

// WeightDType is the dtype holding most of the projection weights' bytes
// in the shards with these headers (of all tensors' bytes when there are
// no projections), ties going to the lower dtype: what a manifest records
// as a revision's dtype.
func WeightDType(headers ...*safetensors.Header) dtype.DType {
	proj, all := map[dtype.DType]int64{}, map[dtype.DType]int64{}
	for _, h := range headers {
		for _, t := range h.Tensors {
			all[t.DType] += t.Size()
			if model.IsProjection(t.Name) {
				proj[t.DType] += t.Size()
			}
		}
	}
	if len(proj) == 0 {
		proj = all
	}
	best, most := dtype.Invalid, int64(-1)
	for d, n := range proj {
		if n > most || n == most && d < best {
			best, most = d, n
		}
	}
	return best
}

// Close unmaps every shard. Models built over the checkpoint must not be
// used afterwards.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	c.files = nil
	return errors.Join(errs...)
}

// LoadModel opens the checkpoint in dir and builds its model. The returned
// checkpoint backs the model's weights: close it only when done with both.
func LoadModel(dir string, pool *kernels.Pool) (*model.Model, *Checkpoint, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, nil, err
	}
	m, err := c.Model(pool)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return m, c, nil
}

// Model builds the checkpoint's model over its tensors, computing on pool.
func (c *Checkpoint) Model(pool *kernels.Pool) (*model.Model, error) {
	m, err := model.New(c.Config(), c, pool)
	if err != nil {
		return nil, fmt.Errorf("load model from %s: %w", c.dir, err)
	}
	return m, nil
}
