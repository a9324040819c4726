// Package load turns a checkpoint into a servable model: weights mapped
// from a directory on the node, or streamed from a bucket revision into the
// device (through the node cache); a tokenizer; and engines started on a
// fresh KV pool. It is the one load path the engine server uses.
package load

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/device"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/loader"
	"github.com/stokehq/stoke/weightstore/nodecache"
)

// Options describe the CPU engines a checkpoint is served with and where
// bucket revisions are streamed.
type Options struct {
	Engine server.EngineOptions
	// KVCacheBytes is the memory of each engine's KV pool.
	KVCacheBytes int64
	// Threads computing the model; 0 means every core.
	Threads int
	// Kernels is the kernel set the model computes with; nil means
	// kernels.Default (STOKE_KERNELS, else the fastest this CPU runs).
	Kernels *kernels.Set
	// Device receives streamed weights; nil means the CPU.
	Device device.Device
	// Cache is the node cache bucket revisions go through; nil streams
	// every load from the bucket.
	Cache nodecache.Cache
	// Stream tunes the streaming loader (its Progress is set per load).
	Stream loader.Options
	// S3 configures s3:// sources.
	S3 bucket.S3Options
}

// Checkpoint returns the loader for checkpoints in a directory on this node
// (LoadRequest.Path) and revisions in buckets (Source, Model, Revision).
func Checkpoint(o Options) server.Loader {
	if o.Device == nil {
		o.Device = device.NewCPU()
	}
	return func(ctx context.Context, req engineapi.LoadRequest, progress func(engineapi.LoadProgress)) (*server.Loaded, error) {
		if progress == nil {
			progress = func(engineapi.LoadProgress) {}
		}
		// Each load works on its own copy of the options: what one request
		// asks for (its served name) must not stick to later loads, nor race
		// with loads running at the same time.
		lo := o
		if req.ServedModelName != "" {
			lo.Engine.ServedName = req.ServedModelName
		}
		if req.Path != "" {
			return lo.fromDir(req.Path, progress)
		}
		return lo.fromBucket(ctx, req, progress)
	}
}

func (o Options) fromDir(path string, progress func(engineapi.LoadProgress)) (*server.Loaded, error) {
	progress(engineapi.LoadProgress{Tier: "local"})
	tok := parseTokenizer(func() (*tokenizer.Tokenizer, error) { return tokenizer.Load(path) })
	ck, err := checkpoint.Open(path)
	if err != nil {
		tok()
		return nil, err
	}
	name := o.Engine.ServedName
	if name == "" {
		name = filepath.Base(filepath.Clean(path))
	}
	return o.serve(name, ck, tok, ck.Close)
}

// parseTokenizer parses a model's tokenizer in the background, as it takes
// about as long as building the model over weights already in memory; the
// function it returns waits for the result (nil for a model without one).
func parseTokenizer(parse func() (*tokenizer.Tokenizer, error)) func() (*tokenizer.Tokenizer, error) {
	type result struct {
		tok *tokenizer.Tokenizer
		err error
	}
	done := make(chan result, 1)
	go func() {
		tok, err := parse()
		if errors.Is(err, tokenizer.ErrNoTokenizer) {
			tok, err = nil, nil
		}
		done <- result{tok, err}
	}()
	return sync.OnceValues(func() (*tokenizer.Tokenizer, error) {
		r := <-done
		return r.tok, r.err
	})
}

func (o Options) fromBucket(ctx context.Context, req engineapi.LoadRequest, progress func(engineapi.LoadProgress)) (*server.Loaded, error) {
	b, err := bucket.Open(ctx, req.Source, o.S3)
	if err != nil {
		return nil, err
	}
	so := o.Stream
	so.Progress = func(p loader.Progress) {
		progress(engineapi.LoadProgress{Bytes: p.Bytes, TotalBytes: p.Total, GBps: p.GBps(), ElapsedSeconds: p.Elapsed.Seconds()})
	}
	var tok func() (*tokenizer.Tokenizer, error)
	so.HostFiles = func(host map[string][]byte) {
		tok = parseTokenizer(func() (*tokenizer.Tokenizer, error) {
			t, err := tokenizer.FromFiles(host)
			if err != nil {
				err = fmt.Errorf("load %s: %w", req, err)
			}
			return t, err
		})
	}
	res, err := loader.LoadRevision(ctx, o.Device, o.Cache, loader.Request{Bucket: b, Model: req.Model, Revision: req.Revision}, so)
	if err != nil {
		if tok != nil {
			tok()
		}
		return nil, err
	}
	if tok == nil { // a load with no host files to hand over
		so.HostFiles(res.Host)
	}
	progress(engineapi.LoadProgress{Revision: res.Manifest.Revision, Tier: res.Tier, Bytes: res.Manifest.TotalBytes,
		TotalBytes: res.Manifest.TotalBytes, GBps: float64(res.Manifest.TotalBytes) / res.Elapsed.Seconds() / 1e9, ElapsedSeconds: res.Elapsed.Seconds()})
	files, ok := res.Files()
	if !ok {
		tok()
		res.Free()
		return nil, fmt.Errorf("load %s: the CPU engine cannot compute on %s memory", req, o.Device.Name())
	}
	ck, err := checkpoint.OpenMemory(req.String(), files)
	if err != nil {
		tok()
		res.Free()
		return nil, err
	}
	name := o.Engine.ServedName
	if name == "" {
		name = req.Model
	}
	return o.serve(name, ck, tok, func() error { return errors.Join(ck.Close(), res.Free()) })
}

// serve builds the model over ck's tensors and the Loaded that starts its
// engines, with the tokenizer parseTokenizer returns; release frees the
// weights once the model is done.
func (o Options) serve(name string, ck *checkpoint.Checkpoint, parsed func() (*tokenizer.Tokenizer, error), release func() error) (*server.Loaded, error) {
	ks := o.Kernels
	if ks == nil {
		var err error
		if ks, err = kernels.Default(); err != nil {
			parsed() // the tokenizer parse reads the weights' memory: let it finish first
			return nil, errors.Join(err, release())
		}
	}
	pool := ks.NewPool(o.Threads)
	closeAll := func() error {
		pool.Close()
		return release()
	}
	m, err := ck.Model(pool)
	tok, tokErr := parsed()
	if err = errors.Join(err, tokErr); err != nil {
		closeAll()
		return nil, err
	}
	spec, releaseDraft, err := o.speculation(m, pool)
	if err != nil {
		closeAll()
		return nil, err
	}
	if releaseDraft != nil {
		closeTarget := closeAll
		closeAll = func() error { return errors.Join(releaseDraft(), closeTarget()) }
	}
	cfg := m.Config()
	blocks := kvcache.BlocksForBudget(m.KVShape(), o.KVCacheBytes)
	if blocks < 1 {
		closeAll()
		return nil, fmt.Errorf("a KV cache of %d bytes holds no block of %s (%d bytes each)", o.KVCacheBytes, name, m.KVShape().BytesPerBlock())
	}
	ec := core.Config{Sched: o.Engine.SchedFor(cfg.MaxPositionEmbeddings), Spec: spec}
	for _, id := range cfg.EOSTokenID {
		ec.EOS = append(ec.EOS, int32(id))
	}
	if tok != nil {
		ec.EOS = append(ec.EOS, tok.EOS()...)
	}
	if ec.Adapters, err = o.Engine.AdapterPool(o.adapterLoader(cfg)); err != nil {
		closeAll()
		return nil, err
	}
	if ec.Adapters != nil {
		closeModel, adapters := closeAll, ec.Adapters
		closeAll = func() error { adapters.Close(); return closeModel() }
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
			e, err := core.New(ec, kvcache.NewManager(blocks, o.Engine.PrefixCaching), core.NewModelExecutor(m, storage), tok, metrics)
			if err != nil {
				storage.Free()
			}
			return e, err
		},
		Close:    closeAll,
		Adapters: ec.Adapters,
	}, nil
}
