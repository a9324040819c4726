package load

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/loader"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// bucketAdapter is an adapter revision read from a bucket into memory.
type bucketAdapter struct {
	// Config is adapter_config.json.
	Config []byte
	// Weights views adapter_model.safetensors in memory freed by Release.
	Weights *safetensors.File
	// Revision is the revision digest read.
	Revision string
	Release  func() error
}

// IsBucketPath reports whether an adapter's lora_path names a bucket
// prefix (s3:// or file://) rather than a directory on this node.
func IsBucketPath(path string) bool {
	return strings.HasPrefix(path, "s3://") || strings.HasPrefix(path, "file://")
}

// adapterFromBucket reads the adapter committed at the bucket prefix url
// (…/BASE/adapters/NAME), at revision when set, every byte checked
// against its manifest's sha256 as a model's are.
func (o Options) adapterFromBucket(ctx context.Context, url, revision string) (*bucketAdapter, error) {
	url = strings.TrimSuffix(url, "/")
	i := strings.LastIndexByte(url, '/')
	if i < 0 || i == len(url)-1 {
		return nil, fmt.Errorf("adapter %s: not a bucket prefix", url)
	}
	parent, name := url[:i], url[i+1:]
	b, err := bucket.Open(ctx, parent, o.S3)
	if err != nil {
		return nil, fmt.Errorf("adapter %s: %w", url, err)
	}
	res, err := loader.LoadRevision(ctx, o.Device, nil, loader.Request{Bucket: b, Model: name, Revision: revision}, loader.Options{})
	if err != nil {
		return nil, fmt.Errorf("adapter %s: %w", url, err)
	}
	files, ok := res.Files()
	if !ok {
		res.Free()
		return nil, fmt.Errorf("adapter %s: the CPU engine cannot compute on %s memory", url, o.Device.Name())
	}
	cfg, ok := res.Host[checkpoint.AdapterConfigFile]
	data, hasWeights := files[checkpoint.AdapterWeightsFile]
	if !ok || !hasWeights {
		res.Free()
		return nil, fmt.Errorf("adapter %s: revision %s lacks %s or %s", url, res.Manifest.Revision, checkpoint.AdapterConfigFile, checkpoint.AdapterWeightsFile)
	}
	f, err := safetensors.FromBytes(url+"/"+checkpoint.AdapterWeightsFile, data)
	if err != nil {
		res.Free()
		return nil, fmt.Errorf("adapter %s: %w", url, err)
	}
	return &bucketAdapter{Config: cfg, Weights: f, Revision: res.Manifest.Revision,
		Release: func() error { return errors.Join(f.Close(), res.Free()) }}, nil
}
