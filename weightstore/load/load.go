// Package load turns a checkpoint into a servable model: weights mapped
// from the node, a tokenizer, and engines started on a fresh KV pool. It
// is the one load path the engine server uses; bucket sources extend it.
package load

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// Options describe the CPU engines a checkpoint is served with.
type Options struct {
	Engine server.EngineOptions
	// KVCacheBytes is the memory of each engine's KV pool.
	KVCacheBytes int64
	// Threads computing the model; 0 means every core.
	Threads int
}

// Checkpoint returns a loader for checkpoint directories on this node.
func Checkpoint(o Options) server.Loader {
	return func(ctx context.Context, path string) (*server.Loaded, error) {
		tok, err := tokenizer.Load(path)
		if err != nil && !errors.Is(err, tokenizer.ErrNoTokenizer) {
			return nil, err
		}
		pool := kernels.NewPool(o.Threads)
		m, ck, err := checkpoint.LoadModel(path, pool)
		if err != nil {
			pool.Close()
			return nil, err
		}
		release := func() error {
			pool.Close()
			return ck.Close()
		}
		cfg := m.Config()
		blocks := kvcache.BlocksForBudget(m.KVShape(), o.KVCacheBytes)
		if blocks < 1 {
			release()
			return nil, fmt.Errorf("a KV cache of %d bytes holds no block of %s (%d bytes each)", o.KVCacheBytes, path, m.KVShape().BytesPerBlock())
		}
		ec := core.Config{Sched: o.Engine.SchedFor(cfg.MaxPositionEmbeddings)}
		for _, id := range cfg.EOSTokenID {
			ec.EOS = append(ec.EOS, int32(id))
		}
		if tok != nil {
			ec.EOS = append(ec.EOS, tok.EOS()...)
		}
		name := o.Engine.ServedName
		if name == "" {
			name = filepath.Base(filepath.Clean(path))
		}
		return &server.Loaded{
			Name:        name,
			Tokenizer:   tok,
			MaxModelLen: ec.Sched.MaxModelLen,
			Start: func(metrics *core.Metrics) (*core.Engine, error) {
				storage, err := kvcache.New(m.KVShape(), blocks)
				if err != nil {
					return nil, err
				}
				return core.New(ec, kvcache.NewManager(blocks, o.Engine.PrefixCaching), core.NewModelExecutor(m, storage), tok, metrics)
			},
			Close: release,
		}, nil
	}
}
