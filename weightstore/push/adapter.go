package push

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// AdapterBase splits the destination of an adapter,
// SCHEME://…/BASE/adapters/NAME, into its base model's URL and name; ok
// is false for a destination of another shape.
func AdapterBase(url string) (baseURL, base string, ok bool) {
	url = strings.TrimSuffix(url, "/")
	i := strings.LastIndexByte(url, '/')
	if i < 0 {
		return "", "", false
	}
	parent := url[:i]
	baseURL, ok = strings.CutSuffix(parent, "/"+manifest.AdaptersDir)
	if !ok {
		return "", "", false
	}
	scheme, _, prefix, err := bucket.SplitURL(baseURL)
	if err != nil || scheme == "s3" && prefix == "" {
		return "", "", false // a model is a prefix of its bucket
	}
	if base, err = ModelName(baseURL); err != nil {
		return "", "", false
	}
	return baseURL, base, true
}

// IsAdapter reports whether dir holds a PEFT LoRA adapter
// (adapter_config.json) rather than a checkpoint.
func IsAdapter(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, checkpoint.AdapterConfigFile))
	return err == nil && fi.Mode().IsRegular()
}

// checkAdapter checks the adapter in dir against its base model, the
// committed revision at opts.Base, and returns the base's manifest and the
// adapter's dtype.
func checkAdapter(ctx context.Context, dir string, opts Options) (*manifest.Manifest, dtype.DType, error) {
	switch {
	case opts.Quantize:
		return nil, 0, fmt.Errorf("push %s: an adapter is pushed as it is: --quantize applies to checkpoints", dir)
	case opts.ShardSize > 0:
		return nil, 0, fmt.Errorf("push %s: an adapter is pushed as it is: --shard-size applies to checkpoints", dir)
	case opts.Base == nil:
		return nil, 0, fmt.Errorf("push %s: an adapter goes under its base model, to …/BASE/%s/NAME", dir, manifest.AdaptersDir)
	}
	base, err := readManifest(ctx, opts.Base)
	if err != nil {
		return nil, 0, fmt.Errorf("push %s: base model at %s: %w", dir, opts.Base.URL(), err)
	}
	if base == nil {
		return nil, 0, fmt.Errorf("push %s: the base model at %s has no committed revision: push it first", dir, opts.Base.URL())
	}
	baseConfig, err := readObject(ctx, opts.Base, checkpoint.ConfigFile)
	if err != nil {
		return nil, 0, fmt.Errorf("push %s: base model at %s: %w", dir, opts.Base.URL(), err)
	}
	adapterConfig, err := os.ReadFile(filepath.Join(dir, checkpoint.AdapterConfigFile))
	if err != nil {
		return nil, 0, fmt.Errorf("push %s: %w", dir, err)
	}
	f, err := safetensors.Open(filepath.Join(dir, checkpoint.AdapterWeightsFile))
	if err != nil {
		return nil, 0, fmt.Errorf("push %s: refusing a broken adapter: %w", dir, err)
	}
	defer f.Close()
	dt, err := checkpoint.CheckAdapter(baseConfig, adapterConfig, f.Header())
	if err != nil {
		return nil, 0, fmt.Errorf("push %s: refusing an adapter that does not fit %s (%s): %w", dir, base.Model, base.Revision, err)
	}
	return base, dt, nil
}

// readObject reads a small object of b whole.
func readObject(ctx context.Context, b bucket.Bucket, key string) ([]byte, error) {
	r, err := b.ReadRange(ctx, key, 0, -1)
	if errors.Is(err, bucket.ErrNotExist) {
		return nil, fmt.Errorf("%s is missing", key)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	return data, nil
}
