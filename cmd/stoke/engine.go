package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/engine/device"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/runtime/process"
	"github.com/stokehq/stoke/weightstore/load"
	"github.com/stokehq/stoke/weightstore/load/cudaload"
	"github.com/stokehq/stoke/weightstore/loader"
)

type engineFlags struct {
	model, listen, servedName, kvMemory, simProfile string
	kernels, device                                 string
	blank, sim, noPrefixCaching                     bool
	maxBatchedTokens, maxNumSeqs, maxModelLen       int
	lowerPriorityPrefill                            int
	threads                                         int
	drainTimeout                                    time.Duration
	cache                                           cacheFlags
	loadParallel                                    int
	loadChunk, weightArena                          string
	logFile, logMaxSize                             string
	logBackups                                      int
	s3                                              *s3Flags
	speculativeConfig                               string
	speculative                                     *server.SpeculativeConfig // parsed from speculativeConfig
	enableLoRA                                      bool
	maxLoras, maxLoRARank                           int
	loraModules                                     []string
	lora                                            server.LoRAOptions // parsed from the LoRA flags
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
	fl.IntVar(&f.lowerPriorityPrefill, "lower-priority-prefill-tokens", 32, "prompt tokens a step computes at most for requests of lower priority than the highest running or waiting (batch beside interactive); 0 = no cap")
	fl.IntVar(&f.maxModelLen, "max-model-len", 0, "context length (0 = the model's)")
	fl.BoolVar(&f.noPrefixCaching, "no-enable-prefix-caching", false, "turn prefix caching off")
	fl.IntVar(&f.threads, "threads", 0, "compute threads (0 = all cores)")
	fl.StringVar(&f.device, "device", "cpu", "what the model computes on: cpu, or cuda / cuda:N (a binary built with -tags cuda)")
	addKernelsFlag(fl, &f.kernels)
	fl.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second, "how long SIGTERM waits for in-flight requests")
	fl.IntVar(&f.loadParallel, "load-parallel", 8, "concurrent ranged reads when loading from a bucket or the node cache")
	fl.StringVar(&f.loadChunk, "load-chunk-size", "4MiB", "size of one ranged read when loading")
	fl.StringVar(&f.weightArena, "weight-arena", "0", "pre-fault this much memory at start for the weights of bucket loads, as a warm runtime does (0 = allocate per load)")
	fl.StringVar(&f.logFile, "log-file", "", "write the log, and standard output and error, to this file, rotated past --log-max-size (default: log to standard error)")
	fl.StringVar(&f.logMaxSize, "log-max-size", "10MiB", "size at which --log-file rotates (whole MiB)")
	fl.IntVar(&f.logBackups, "log-max-backups", process.DefaultLogBackups, "rotated copies of --log-file kept")
	fl.StringVar(&f.speculativeConfig, "speculative-config", "", `speculative decoding, as vLLM's JSON: {"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2} or {"method":"draft_model","model":"DIR","num_speculative_tokens":4}, with "disable_by_batch_size" (default `+fmt.Sprint(server.DefaultDisableByBatchSize)+`, 0 = never); requests opt out with "speculative": false`)
	fl.BoolVar(&f.enableLoRA, "enable-lora", false, "serve LoRA adapters over the model: requests name BASE:ADAPTER or ADAPTER; load them with --lora-modules, POST /admin/adapters or /v1/load_lora_adapter")
	fl.IntVar(&f.maxLoras, "max-loras", server.LoRAOptions{}.WithDefaults().MaxLoras, "LoRA adapter slots: most adapters holding their weights (and so in one batch) at once; others load on demand, evicting the least recently used")
	fl.IntVar(&f.maxLoRARank, "max-lora-rank", server.LoRAOptions{}.WithDefaults().MaxRank, "largest LoRA rank (r) an adapter may have")
	fl.StringArrayVar(&f.loraModules, "lora-modules", nil, `LoRA adapters registered when the model loads: name=path, or {"name":…,"path":…,"revision":…}; repeat the flag for more (needs --enable-lora)`)
	f.cache.add(fl)
	f.s3 = addS3Flags(fl)
	return cmd
}

func runEngine(ctx context.Context, f engineFlags) error {
	modes := 0
	for _, on := range []bool{f.model != "", f.blank, f.sim} {
		if on {
			modes++
		}
	}
	if modes != 1 && !(modes == 2 && f.blank && f.sim) {
		return errors.New("give exactly one of --model DIR, --blank and --sim (or --blank --sim: a sim engine that loads on demand)")
	}
	if f.logFile != "" {
		closeLog, err := logToFile(ctx, f)
		if err != nil {
			return err
		}
		defer closeLog()
	}
	kvBytes, err := sizeFlag("kv-cache-memory", f.kvMemory, 1, maxSize)
	if err != nil {
		return err
	}
	chunk, err := sizeFlag("load-chunk-size", f.loadChunk, 1, 1<<30)
	if err != nil {
		return err
	}
	ks, err := selectKernels(f.kernels)
	if err != nil {
		return err
	}
	if f.speculative, err = server.ParseSpeculativeConfig(f.speculativeConfig); err != nil {
		return fmt.Errorf("--speculative-config: %w", err)
	}
	if f.lora, err = f.loraOptions(); err != nil {
		return err
	}
	slog.Info("kernels", "set", ks.Name())
	opts := load.Options{Engine: f.engineOptions(), KVCacheBytes: kvBytes, Threads: f.threads, Kernels: ks, S3: f.s3.options(),
		Stream: loader.Options{Parallel: f.loadParallel, ChunkSize: int(chunk)}}
	path := f.model
	var ld server.Loader
	if f.sim {
		ld = server.SimLoader(f.engineOptions(), f.simProfile)
		if !f.blank {
			path = f.simProfile
		}
	} else {
		cache, closeCache, err := f.cache.open(ctx)
		if err != nil {
			return err
		}
		defer closeCache()
		opts.Cache = cache
		arena, err := sizeFlag("weight-arena", f.weightArena, 0, maxSize)
		if err != nil {
			return err
		}
		if arena > 0 {
			dev, err := device.NewCPUArena(arena)
			if err != nil {
				return err
			}
			opts.Device = dev
		}
		if f.device == "cpu" {
			ld = load.Checkpoint(opts)
		} else {
			gpu, closeGPU, err := cudaload.Checkpoint(opts, cudaload.Options{Device: f.device})
			if err != nil {
				return err
			}
			defer closeGPU()
			ld = gpu
		}
	}
	srv, err := server.New(server.Options{Loader: ld, Registry: prometheus.NewRegistry(), DrainTimeout: f.drainTimeout, KernelSet: ks.Name()})
	if err != nil {
		return err
	}
	if path != "" {
		if err := srv.Load(ctx, engineapi.LoadRequest{Path: path}); err != nil {
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
	slog.Info("engine listening", "addr", f.listen, "model", path, "kernels", ks.Name())
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

// logToFile makes --log-file the engine's log (at the level -v chose) and
// its standard output and error: a runtime started by serve outlives it,
// so nothing it writes may go to serve.
func logToFile(ctx context.Context, f engineFlags) (closeLog func(), err error) {
	size, err := sizeFlag("log-max-size", f.logMaxSize, 1, maxSize)
	if err != nil {
		return nil, err
	}
	if f.logBackups < 0 {
		return nil, fmt.Errorf("--log-max-backups: %d is negative", f.logBackups)
	}
	backups := f.logBackups
	if backups == 0 {
		backups = -1 // LogOptions' "none"
	}
	w, err := process.OpenLog(process.LogOptions{Path: f.logFile, MaxBytes: size, Backups: backups})
	if err != nil {
		return nil, fmt.Errorf("--log-file: %w", err)
	}
	level := slog.LevelInfo
	if slog.Default().Enabled(ctx, slog.LevelDebug) {
		level = slog.LevelDebug
	}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})))
	return func() {
		slog.SetDefault(prev)
		w.Close()
	}, nil
}

// engineOptions are the flags every loader shares.
func (f engineFlags) engineOptions() server.EngineOptions {
	return server.EngineOptions{
		Sched: sched.Config{MaxNumBatchedTokens: f.maxBatchedTokens, MaxNumSeqs: f.maxNumSeqs, MaxModelLen: f.maxModelLen,
			LowerPriorityPrefill: f.lowerPriorityPrefill},
		PrefixCaching: !f.noPrefixCaching,
		ServedName:    f.servedName,
		Speculative:   f.speculative,
		LoRA:          f.lora,
	}
}

// loraOptions checks and parses the LoRA flags.
func (f engineFlags) loraOptions() (server.LoRAOptions, error) {
	switch {
	case !f.enableLoRA && len(f.loraModules) > 0:
		return server.LoRAOptions{}, errors.New("--lora-modules needs --enable-lora")
	case f.maxLoras < 1:
		return server.LoRAOptions{}, fmt.Errorf("--max-loras must be positive, got %d", f.maxLoras)
	case f.maxLoRARank < 1:
		return server.LoRAOptions{}, fmt.Errorf("--max-lora-rank must be positive, got %d", f.maxLoRARank)
	}
	modules, err := server.ParseLoRAModules(f.loraModules)
	if err != nil {
		return server.LoRAOptions{}, err
	}
	return server.LoRAOptions{Enabled: f.enableLoRA, MaxLoras: f.maxLoras, MaxRank: f.maxLoRARank, Modules: modules}, nil
}
