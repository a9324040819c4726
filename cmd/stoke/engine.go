package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/engine/sim"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

type engineFlags struct {
	model, listen, servedName, kvMemory, simProfile string
	blank, sim, noPrefixCaching                     bool
	maxBatchedTokens, maxNumSeqs, maxModelLen       int
	threads                                         int
	drainTimeout                                    time.Duration
}

func newEngineCmd() *cobra.Command {
	var f engineFlags
	cmd := &cobra.Command{
		Use:   "engine (--model DIR | --blank | --sim --sim-profile NAME|FILE)",
		Short: "Run one inference engine with an OpenAI-compatible HTTP API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runEngine(cmd.Context(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.model, "model", "", "checkpoint directory to serve")
	fl.BoolVar(&f.blank, "blank", false, "start with no model; load one with POST /admin/load")
	fl.BoolVar(&f.sim, "sim", false, "simulate a GPU model with a latency profile instead of computing")
	fl.StringVar(&f.simProfile, "sim-profile", "llama-3.1-8b-fp8-h100", "sim latency profile: an embedded name or a YAML/JSON file")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8000", "address: host:port or unix:///path.sock")
	fl.StringVar(&f.servedName, "served-model-name", "", "model name in the API (default: the directory's name or the profile's model)")
	fl.StringVar(&f.kvMemory, "kv-cache-memory", "2GiB", "memory for the KV cache")
	fl.IntVar(&f.maxBatchedTokens, "max-num-batched-tokens", 2048, "token budget of one scheduler step")
	fl.IntVar(&f.maxNumSeqs, "max-num-seqs", 256, "most requests running at once")
	fl.IntVar(&f.maxModelLen, "max-model-len", 0, "context length (0 = the model's)")
	fl.BoolVar(&f.noPrefixCaching, "no-enable-prefix-caching", false, "turn prefix caching off")
	fl.IntVar(&f.threads, "threads", 0, "compute threads (0 = all cores)")
	fl.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second, "how long SIGTERM waits for in-flight requests")
	return cmd
}

func runEngine(ctx context.Context, f engineFlags) error {
	modes := 0
	for _, on := range []bool{f.model != "", f.blank, f.sim} {
		if on {
			modes++
		}
	}
	if modes != 1 {
		return errors.New("give exactly one of --model DIR, --blank and --sim")
	}
	kvBytes, err := parseSize(f.kvMemory)
	if err != nil || kvBytes <= 0 {
		return fmt.Errorf("--kv-cache-memory: %q is not a positive size", f.kvMemory)
	}
	loader := modelLoader(f, kvBytes)
	path := f.model
	if f.sim {
		loader, path = simLoader(f), f.simProfile
	}
	srv, err := server.New(server.Options{Loader: loader, Registry: prometheus.NewRegistry(), DrainTimeout: f.drainTimeout})
	if err != nil {
		return err
	}
	if path != "" {
		if err := srv.Load(ctx, path); err != nil {
			return err
		}
	}
	ln, err := server.Listen(f.listen)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	slog.Info("engine listening", "addr", f.listen, "model", path)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	slog.Info("draining", "timeout", f.drainTimeout)
	drainCtx, cancel := context.WithTimeout(context.Background(), f.drainTimeout)
	defer cancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		slog.Warn("drain ended early", "err", err)
	}
	return hs.Shutdown(drainCtx)
}

func (f engineFlags) schedConfig(maxModelLen int) sched.Config {
	if f.maxModelLen > 0 {
		maxModelLen = min(maxModelLen, f.maxModelLen)
	}
	return sched.Config{MaxNumBatchedTokens: f.maxBatchedTokens, MaxNumSeqs: f.maxNumSeqs, MaxModelLen: maxModelLen}
}

// modelLoader loads a checkpoint directory onto the CPU engine.
func modelLoader(f engineFlags, kvBytes int64) server.Loader {
	return func(ctx context.Context, path string) (*server.Loaded, error) {
		tok, err := tokenizer.Load(path)
		if err != nil && !errors.Is(err, tokenizer.ErrNoTokenizer) {
			return nil, err
		}
		pool := kernels.NewPool(f.threads)
		m, ck, err := checkpoint.LoadModel(path, pool)
		if err != nil {
			pool.Close()
			return nil, err
		}
		cfg := m.Config()
		blocks := kvcache.BlocksForBudget(m.KVShape(), kvBytes)
		if blocks < 1 {
			ck.Close()
			pool.Close()
			return nil, fmt.Errorf("--kv-cache-memory %s holds no KV block of this model (%d bytes each)", f.kvMemory, m.KVShape().BytesPerBlock())
		}
		ec := core.Config{Sched: f.schedConfig(cfg.MaxPositionEmbeddings)}
		for _, id := range cfg.EOSTokenID {
			ec.EOS = append(ec.EOS, int32(id))
		}
		if tok != nil {
			ec.EOS = append(ec.EOS, tok.EOS()...)
		}
		name := f.servedName
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
				return core.New(ec, kvcache.NewManager(blocks, !f.noPrefixCaching), core.NewModelExecutor(m, storage), tok, metrics)
			},
			Close: func() error {
				pool.Close()
				return ck.Close()
			},
		}, nil
	}
}

// simLoader serves a latency profile instead of a model.
func simLoader(f engineFlags) server.Loader {
	return func(ctx context.Context, name string) (*server.Loaded, error) {
		p, err := sim.LoadProfile(name)
		if err != nil {
			return nil, err
		}
		tj, tc, err := tokenizer.Synthesize(p.VocabSize, 1)
		if err != nil {
			return nil, err
		}
		tok, err := tokenizer.New(tj, tc)
		if err != nil {
			return nil, err
		}
		ec := core.Config{Sched: f.schedConfig(p.MaxModelLen), EOS: tok.EOS()}
		ec.Sched.MaxNumSeqs = min(ec.Sched.MaxNumSeqs, p.MaxNumSeqs)
		served := f.servedName
		if served == "" {
			served = p.Model
		}
		blocks := p.KVCapacityTokens / kvcache.BlockSize
		return &server.Loaded{
			Name:        served,
			Tokenizer:   tok,
			MaxModelLen: ec.Sched.MaxModelLen,
			Start: func(metrics *core.Metrics) (*core.Engine, error) {
				return core.New(ec, kvcache.NewManager(blocks, !f.noPrefixCaching), core.NewSimExecutor(p, tok, nil), tok, metrics)
			},
			Close: func() error { return nil },
		}, nil
	}
}
