package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/batch"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/scaler"
	"github.com/stokehq/stoke/scaler/reconcile"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/watch"
)

// controlPlane is what only one gateway runs: the runtimes and their
// manager, the bucket watcher, reconcile with the scaler, the batch
// runner and the spot watcher. A lone serve starts it at once; with
// --leader-elect, the gateway that holds the Lease does.
type controlPlane struct {
	f                            serveFlags
	data                         string
	slots                        []runtime.Class
	sleepBudget, arena, cacheMax int64
	st                           *store.Store
	bucket                       bucket.Bucket
	act                          *activator.Activator
	batches                      *batch.Service
	late                         *lateController
	reg                          *prometheus.Registry

	// mu orders start, which a leader election may run at any time,
	// before wait and stop.
	mu      sync.Mutex
	done    []chan struct{}
	closers []func()
}

// start builds the control plane and runs its loops until ctx ends;
// reconcile routes through router.
func (c *controlPlane) start(ctx context.Context, router reconcile.Router) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.f
	// Runtimes are short-lived sockets: keep their directory short too.
	rtDir := filepath.Join(c.data, "rt")
	node, err := openNodeRuntime(ctx, f.runtime, c.data, rtDir, f.bucketURL, c.cacheMax)
	if err != nil {
		return err
	}
	c.closers = append(c.closers, node.close)
	// The engines get no node cache of their own: the runtime manager
	// decides where each load's bytes come from and fills the cache.
	engineArgs := []string{"--kv-cache-memory", f.kvMemory, "--max-num-seqs", fmt.Sprint(f.maxNumSeqs), "--threads", fmt.Sprint(f.threads),
		"--lower-priority-prefill-tokens", fmt.Sprint(f.lowerPriorityPrefill)}
	if node.cache == nil && f.runtime.kube.cachePath != "" { // the engines' own node cache
		engineArgs = append(engineArgs, "--cache-dir", f.runtime.kube.cachePath)
	} else {
		engineArgs = append(engineArgs, "--no-cache")
	}
	if f.kernels != "" {
		engineArgs = append(engineArgs, "--kernels", f.kernels)
	}
	if f.maxLoras > 0 {
		engineArgs = append(engineArgs, "--enable-lora", "--max-loras", fmt.Sprint(f.maxLoras), "--max-lora-rank", fmt.Sprint(f.maxLoRARank))
	}
	if f.speculativeConfig != "" {
		engineArgs = append(engineArgs, "--speculative-config", f.speculativeConfig)
	}
	if f.simProfile != "" {
		engineArgs = append(engineArgs, "--sim", "--sim-profile", f.simProfile)
	}
	if f.s3.flags.Changed("endpoint") {
		engineArgs = append(engineArgs, "--endpoint", f.s3.endpoint)
	}
	if f.s3.flags.Changed("region") {
		engineArgs = append(engineArgs, "--region", f.s3.region)
	}
	if f.s3.pathStyle {
		engineArgs = append(engineArgs, "--path-style")
	}
	var loadCache nodecache.Cache
	if node.cache != nil && f.simProfile == "" { // sim engines read no weights: nothing to cache
		loadCache = node.cache
	}
	mgr, err := runtime.New(ctx, runtime.Options{Backend: node.backend, Dir: rtDir, Slots: c.slots, Warm: f.warm, SleepBudget: c.sleepBudget,
		Source: f.bucketURL, Cache: loadCache, Bucket: c.bucket, WeightArena: c.arena, EngineArgs: engineArgs, OnEvent: c.late.onRuntimeEvent,
		RetireSurplus: node.cluster, KeepOnClose: node.cluster})
	if err != nil {
		return err
	}
	c.closers = append(c.closers, func() {
		cctx, cancel := context.WithTimeout(context.Background(), f.drain)
		defer cancel()
		mgr.Close(cctx)
	})
	c.reg.MustRegister(mgr.Collector())
	var prefetch func(ctx context.Context, model, revision string) error
	if f.prefetch && f.simProfile == "" && node.cache != nil { // sim engines read no weights
		prefetch = mgr.Prefetch
	}
	ctrl, err := reconcile.New(ctx, reconcile.Options{Store: c.st, Runtimes: mgr, Router: router, NewDecider: reconcile.NewAutoscaler,
		ReplicaCapacity: f.maxNumSeqs, Slots: len(c.slots), Metrics: scaler.NewMetrics(c.reg), Registerer: c.reg, Cache: node.cache, Warm: f.warm, Prefetch: prefetch,
		ReadFile: revisionFiles(c.bucket, c.st), Evaluate: evalOn(c.act)})
	if err != nil {
		return err
	}
	c.late.set(ctrl)
	c.late.setManager(mgr)
	w := watch.New(c.bucket, c.st, watch.Options{Interval: f.interval, Quiet: f.quiet, OnRevision: ctrl.OnRevision})
	if err := startSpotWatcher(ctx, f.spot, ctrl.DrainClass, slog.Default(), c.reg); err != nil {
		return err
	}
	c.goRun(func() { w.Run(ctx) })
	c.goRun(func() { ctrl.Run(ctx) })
	c.goRun(func() { c.batches.Run(ctx) })
	return nil
}

// goRun runs fn in a goroutine that wait waits for.
func (c *controlPlane) goRun(fn func()) {
	done := make(chan struct{})
	c.done = append(c.done, done)
	go func() { defer close(done); fn() }()
}

// wait waits until the loops have returned (their context ended).
func (c *controlPlane) wait() {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	for _, d := range done {
		<-d
	}
}

// stop waits for the loops, then stops the runtimes (each backend decides
// what outlives serve) and closes the node runtime.
func (c *controlPlane) stop() {
	c.wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
	c.closers = nil
}
