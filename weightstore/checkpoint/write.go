package checkpoint

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// Entry is one tensor to write. Its bytes are produced on demand, in file
// order, so checkpoints larger than memory stream out a tensor at a time.
type Entry struct {
	Name  string
	DType dtype.DType
	Shape []int
	Bytes func() ([]byte, error)
}

func (e Entry) size() int64 {
	n := int64(e.DType.Size())
	for _, d := range e.Shape {
		n *= int64(d)
	}
	return n
}

// WriteOptions control how a checkpoint is laid out.
type WriteOptions struct {
	// ShardSize caps a shard's tensor bytes; a tensor larger than the cap
	// gets a shard of its own. Zero means a single model.safetensors.
	ShardSize int64
	// Files are written beside the shards (config.json, tokenizer.json, …).
	Files map[string][]byte
}

// Write creates dir as a complete checkpoint. Everything is written into a
// temporary sibling directory that is renamed to dir last, so an
// interrupted write never leaves a partial checkpoint at dir. dir must not
// exist or must be empty.
func Write(ctx context.Context, dir string, entries []Entry, opts WriteOptions) (err error) {
	if err := ensureAbsentOrEmpty(dir); err != nil {
		return err
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".partial-")
	if err != nil {
		return fmt.Errorf("write checkpoint %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := writeShards(ctx, tmp, entries, opts.ShardSize); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", dir, err)
	}
	for name, data := range opts.Files {
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
			return fmt.Errorf("write checkpoint %s: %w", dir, err)
		}
	}
	os.Remove(dir) // empty or absent, checked above
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", dir, err)
	}
	return nil
}

func ensureAbsentOrEmpty(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("write checkpoint %s: %w", dir, err)
	case len(ents) > 0:
		return fmt.Errorf("write checkpoint %s: the directory is not empty", dir)
	}
	return nil
}

// planShards groups entries, in order, into shards of at most shardSize.
func planShards(entries []Entry, shardSize int64) [][]Entry {
	var shards [][]Entry
	var cur []Entry
	var size int64
	for _, e := range entries {
		if len(cur) > 0 && shardSize > 0 && size+e.size() > shardSize {
			shards = append(shards, cur)
			cur, size = nil, 0
		}
		cur = append(cur, e)
		size += e.size()
	}
	if len(cur) > 0 {
		shards = append(shards, cur)
	}
	return shards
}

func writeShards(ctx context.Context, dir string, entries []Entry, shardSize int64) error {
	shards := planShards(entries, shardSize)
	if len(shards) <= 1 {
		return writeShard(ctx, filepath.Join(dir, SingleFile), entries)
	}
	idx := Index{Metadata: map[string]any{}, WeightMap: map[string]string{}}
	var total int64
	for i, shard := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		if err := writeShard(ctx, filepath.Join(dir, name), shard); err != nil {
			return err
		}
		for _, e := range shard {
			idx.WeightMap[e.Name] = name
			total += e.size()
		}
	}
	idx.Metadata["total_size"] = total
	raw, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, IndexFile), raw, 0o644)
}

func writeShard(ctx context.Context, path string, entries []Entry) (err error) {
	infos := make([]safetensors.TensorInfo, len(entries))
	for i, e := range entries {
		infos[i] = safetensors.TensorInfo{Name: e.Name, DType: e.DType, Shape: e.Shape}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	bw := bufio.NewWriterSize(f, 4<<20)
	w, err := safetensors.NewWriter(bw, infos, map[string]string{"format": "pt"})
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := e.Bytes()
		if err != nil {
			return fmt.Errorf("produce tensor %s: %w", e.Name, err)
		}
		if err := w.WriteTensor(e.Name, data); err != nil {
			return fmt.Errorf("write %s: %w", filepath.Base(path), err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return f.Sync()
}
