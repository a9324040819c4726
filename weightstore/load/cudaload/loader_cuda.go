//go:build cuda

package cudaload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/cudaexec"
	"github.com/stokehq/stoke/engine/device/cuda"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/load"
	"github.com/stokehq/stoke/weightstore/loader"
)

// Checkpoint returns the loader for checkpoints in a directory on this
// node (uploaded tensor by tensor) and revisions in buckets (streamed
// into device memory through the node cache, o.Cache), served on the GPU
// co names; close releases the device once every model is closed.
// Speculative decoding and LoRA adapters are not served on the GPU.
func Checkpoint(o load.Options, co Options) (ld server.Loader, close func() error, err error) {
	if o.Engine.Speculative != nil {
		return nil, nil, errors.New("--device cuda does not serve speculative decoding yet: drop --speculative-config")
	}
	if o.Engine.LoRA.Enabled {
		return nil, nil, errors.New("--device cuda does not serve LoRA adapters yet: drop --enable-lora")
	}
	ordinal, err := ParseDevice(co.Device)
	if err != nil {
		return nil, nil, err
	}
	dev, err := cuda.Open(ordinal, cuda.Options{})
	if err != nil {
		return nil, nil, err
	}
	g := &gpuLoader{o: o, co: co, dev: dev}
	return g.load, dev.Close, nil
}

type gpuLoader struct {
	o   load.Options
	co  Options
	dev *cuda.Device
}

func (g *gpuLoader) load(ctx context.Context, req engineapi.LoadRequest, progress func(engineapi.LoadProgress)) (*server.Loaded, error) {
	if progress == nil {
		progress = func(engineapi.LoadProgress) {}
	}
	name := req.ServedModelName
	if req.Path != "" {
		if name == "" {
			name = filepath.Base(filepath.Clean(req.Path))
		}
		return g.fromDir(ctx, name, req.Path, progress)
	}
	if name == "" {
		name = req.Model
	}
	return g.fromBucket(ctx, name, req, progress)
}

func (g *gpuLoader) fromDir(ctx context.Context, name, path string, progress func(engineapi.LoadProgress)) (*server.Loaded, error) {
	progress(engineapi.LoadProgress{Tier: "local"})
	tok, err := tokenizer.Load(path)
	if errors.Is(err, tokenizer.ErrNoTokenizer) {
		tok, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	ck, err := checkpoint.Open(path)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	cfg := ck.Config()
	tensors, free, err := cudaexec.UploadSource(ctx, g.dev, &cfg, ck)
	if err != nil {
		return nil, fmt.Errorf("upload %s to %s: %w", path, g.dev.Name(), err)
	}
	return g.serve(ctx, name, cfg, tensors, tok, free)
}

func (g *gpuLoader) fromBucket(ctx context.Context, name string, req engineapi.LoadRequest, progress func(engineapi.LoadProgress)) (*server.Loaded, error) {
	b, err := bucket.Open(ctx, req.Source, g.o.S3)
	if err != nil {
		return nil, err
	}
	so := g.o.Stream
	so.Progress = func(p loader.Progress) {
		progress(engineapi.LoadProgress{Bytes: p.Bytes, TotalBytes: p.Total, GBps: p.GBps(), ElapsedSeconds: p.Elapsed.Seconds()})
	}
	res, err := loader.LoadRevision(ctx, g.dev, g.o.Cache, loader.Request{Bucket: b, Model: req.Model, Revision: req.Revision}, so)
	if err != nil {
		return nil, err
	}
	progress(engineapi.LoadProgress{Revision: res.Manifest.Revision, Tier: res.Tier, Bytes: res.Manifest.TotalBytes,
		TotalBytes: res.Manifest.TotalBytes, GBps: float64(res.Manifest.TotalBytes) / res.Elapsed.Seconds() / 1e9, ElapsedSeconds: res.Elapsed.Seconds()})
	tensors, cfg, err := FromResult(res)
	if err != nil {
		res.Free()
		return nil, fmt.Errorf("load %s: %w", req, err)
	}
	tok, err := tokenizer.FromFiles(res.Host)
	if errors.Is(err, tokenizer.ErrNoTokenizer) {
		tok, err = nil, nil
	}
	if err != nil {
		res.Free()
		return nil, fmt.Errorf("load %s: %w", req, err)
	}
	return g.serve(ctx, name, cfg, tensors, tok, res.Free)
}

// FromResult indexes the tensors of a revision the streaming loader put
// into CUDA device memory and parses its config.json.
func FromResult(res *loader.Result) (cudaexec.DeviceTensors, model.Config, error) {
	raw, ok := res.Host["config.json"]
	if !ok {
		return nil, model.Config{}, errors.New("the revision has no config.json")
	}
	cfg, err := model.ParseConfig(raw)
	if err != nil {
		return nil, model.Config{}, err
	}
	var files []File
	for name, buf := range res.Device {
		mem, ok := buf.(*cuda.Buffer)
		if !ok {
			return nil, model.Config{}, fmt.Errorf("weight file %s is in %T, not CUDA memory", name, buf)
		}
		files = append(files, File{Name: name, Size: buf.Size(), Mem: mem})
	}
	tensors, err := Tensors(files)
	if err != nil {
		return nil, model.Config{}, err
	}
	return tensors, cfg, nil
}

// serve builds the GPU model over tensors and the Loaded that starts its
// engines; release frees the tensors once the model is closed.
func (g *gpuLoader) serve(ctx context.Context, name string, cfg model.Config, tensors cudaexec.DeviceTensors, tok *tokenizer.Tokenizer, release func() error) (*server.Loaded, error) {
	m, err := cudaexec.New(ctx, g.dev, cfg, tensors, g.co.Model)
	if err != nil {
		return nil, errors.Join(err, release())
	}
	closeAll := func() error { return errors.Join(m.Close(), release()) }
	blocks := kvcache.BlocksForBudget(m.KVShape(), g.o.KVCacheBytes)
	if blocks < 1 {
		closeAll()
		return nil, fmt.Errorf("a KV cache of %d bytes holds no block of %s (%d bytes each)", g.o.KVCacheBytes, name, m.KVShape().BytesPerBlock())
	}
	ec := core.Config{Sched: g.o.Engine.SchedFor(min(cfg.MaxPositionEmbeddings, cudaexec.MaxContext))}
	for _, id := range cfg.EOSTokenID {
		ec.EOS = append(ec.EOS, int32(id))
	}
	if tok != nil {
		ec.EOS = append(ec.EOS, tok.EOS()...)
	}
	slog.Info("serving on the gpu", "model", name, "device", g.dev.Name(), "kv_blocks", blocks, "max_model_len", ec.Sched.MaxModelLen)
	return &server.Loaded{
		Name:        name,
		Tokenizer:   tok,
		MaxModelLen: ec.Sched.MaxModelLen,
		Start: func(metrics *core.Metrics) (*core.Engine, error) {
			x, err := m.NewExecutor(context.Background(), blocks)
			if err != nil {
				return nil, err
			}
			e, err := core.New(ec, kvcache.NewManager(blocks, g.o.Engine.PrefixCaching), x, tok, metrics)
			if err != nil {
				x.Close()
			}
			return e, err
		},
		Close: closeAll,
	}, nil
}
