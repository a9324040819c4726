package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/activator/fleet"
	"github.com/stokehq/stoke/api"
	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/batch"
	"github.com/stokehq/stoke/batch/files"
	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/scaler/reconcile"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/watch"
)

type serveFlags struct {
	listen, data, bucketURL, sleepBudget, weightArena, kvMemory string
	filesURL, routesFile                                        string
	batchWindows                                                []string
	batchInFlight                                               int
	batchTolerance                                              float64
	noUsage                                                     bool
	simProfile, routing, cacheMaxSize, kernels                  string
	slots, warm, maxNumSeqs, threads, lowerPriorityPrefill      int
	goMaxProcs                                                  int
	maxLoras, maxLoRARank                                       int
	speculativeConfig                                           string
	interval, quiet, drain                                      time.Duration
	prefetch                                                    bool
	limits                                                      serveLimits
	s3                                                          *s3Flags
	runtime                                                     runtimeFlags
	spot                                                        spotFlags
	auth                                                        authFlags
	fleet                                                       fleetFlags
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the platform: watch a bucket, serve its models through an OpenAI-compatible API",
		Long: `Serve runs stoke in one process: the state store, the bucket watcher
(every model pushed to the bucket becomes a deployment), the runtime manager
with its warm pool, the scaler and the activator behind the OpenAI-compatible
API. With no flags it listens on 127.0.0.1:8080 and keeps everything under
./.stoke, serving the models pushed to file://$PWD/.stoke/bucket/NAME as NAME.

Serve logs to its standard error. Each runtime logs (its standard output and
error too) to DATA/rt/ID.log, ID as in GET /admin/runtimes; a process runtime
rotates it past 10 MiB, keeping 3 older files beside it (ID-TIME.log), and the
logs of the 8 most recent runtimes that are gone are kept, older ones deleted.
Runtimes outlive a serve that is killed: the next serve on the same --data
re-adopts them and serves on with the ready ones. One serve at a time holds
DATA: it locks DATA/lock (which names its pid), and a second one fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd.Context(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address of the API")
	fl.StringVar(&f.data, "data", ".stoke", "directory of the state, the runtimes and the node cache")
	fl.StringVar(&f.bucketURL, "bucket", "", "bucket whose models are served: s3://bucket[/prefix] or file:///dir (default file://DATA/bucket)")
	fl.StringVar(&f.filesURL, "files", "", "blob store of /v1/files uploads: s3://bucket[/prefix] or file:///dir (default file://DATA/files)")
	fl.StringSliceVar(&f.batchWindows, "batch-completion-windows", []string{batch.DefaultWindow}, "completion windows a batch may ask for (OpenAI offers 24h only; a shorter one is for tests)")
	fl.IntVar(&f.batchInFlight, "batch-max-in-flight", 64, "batch lines in flight per model at most (the runner adapts below it)")
	fl.Float64Var(&f.batchTolerance, "batch-latency-tolerance", batch.DefaultLatencyTolerance, "how much batch lines may slow a model's time per output token (1.1: by 10%) before their concurrency shrinks")
	fl.StringVar(&f.routesFile, "routes", "", "routes file (YAML): routes that resolve model names to deployments by rules and weights, fallback chains, external providers")
	fl.BoolVar(&f.noUsage, "no-usage-records", false, "keep no usage record of requests (each costs a journal write before its answer's last byte)")
	fl.IntVar(&f.slots, "slots", 4, "runtimes this node runs at most")
	fl.IntVar(&f.warm, "warm", 1, "blank runtimes kept started (the warm pool)")
	fl.StringVar(&f.sleepBudget, "sleep-budget", "4GiB", "weight memory sleeping replicas may keep")
	fl.StringVar(&f.weightArena, "weight-arena", "0", "weight memory every runtime pre-faults when it starts")
	fl.StringVar(&f.kvMemory, "kv-cache-memory", "512MiB", "KV cache of every runtime")
	fl.IntVar(&f.maxNumSeqs, "max-num-seqs", 256, "requests one runtime runs at once")
	fl.IntVar(&f.threads, "threads", 0, "compute threads of every runtime (0 = all cores)")
	fl.IntVar(&f.goMaxProcs, "gomaxprocs", 0, "threads serve itself runs Go code on at once, runtimes not included (0 = Go's default, the CPUs it may use); 1 spends the least CPU per request where engines compute on the same cores")
	fl.IntVar(&f.lowerPriorityPrefill, "lower-priority-prefill-tokens", 32, "prompt tokens an engine step computes at most for batch lines while interactive requests are in the engine (0 = no cap)")
	fl.IntVar(&f.maxLoras, "max-loras", core.DefaultMaxLoras, "LoRA adapter slots of every runtime (adapters pushed under a model are served as MODEL:ADAPTER); 0 turns LoRA off")
	fl.IntVar(&f.maxLoRARank, "max-lora-rank", core.DefaultMaxLoRARank, "largest LoRA rank (r) an adapter may have")
	fl.StringVar(&f.speculativeConfig, "speculative-config", "", `speculative decoding in every runtime, as vLLM's JSON (e.g. {"method":"ngram","num_speculative_tokens":4}); a deployment turns it off with speculative: false`)
	addKernelsFlag(fl, &f.kernels)
	fl.DurationVar(&f.interval, "watch-interval", watch.DefaultInterval, "time between two scans of the bucket")
	fl.DurationVar(&f.quiet, "quiet", watch.DefaultQuiet, "how long a plain upload must stay unchanged before it is deployed")
	fl.DurationVar(&f.drain, "drain-timeout", 30*time.Second, "how long SIGTERM waits for requests in flight")
	fl.StringVar(&f.routing, "routing", "prefix", "how replicas are picked: prefix (prefix affinity bounded by load) or least-inflight")
	fl.BoolVar(&f.prefetch, "prefetch", true, "copy every newly deployed revision into the node cache, so its first cold start reads the node cache (t2), not the bucket (t3)")
	fl.StringVar(&f.cacheMaxSize, "cache-max-size", "0", "size budget of the node cache under DATA/cache, least recently used revisions evicted past it (0 = unlimited)")
	fl.StringVar(&f.simProfile, "sim-profile", "", "run sim engines with this latency profile instead of computing (every model is served by it)")
	f.limits.add(fl)
	f.s3 = addS3Flags(fl)
	f.runtime.add(fl)
	f.spot.add(fl)
	f.auth.add(fl)
	f.fleet.add(fl)
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := f.runtime.check(cmd.Flags()); err != nil {
			return err
		}
		return f.fleet.check()
	}
	return cmd
}

func runServe(ctx context.Context, f serveFlags) error {
	// The runtimes compute; a set they could not run must stop serve
	// before it starts them, not fail every load later.
	if _, err := selectKernels(f.kernels); err != nil {
		return err
	}
	sleepBudget, err := sizeFlag("sleep-budget", f.sleepBudget, 0, maxSize)
	if err != nil {
		return err
	}
	arena, err := sizeFlag("weight-arena", f.weightArena, 0, maxSize)
	if err != nil {
		return err
	}
	if _, err := sizeFlag("kv-cache-memory", f.kvMemory, 1, maxSize); err != nil {
		return err
	}
	cacheMax, err := sizeFlag("cache-max-size", f.cacheMaxSize, 0, maxSize)
	if err != nil {
		return err
	}
	sendBuffer, err := sizeFlag("client-send-buffer", f.limits.sendBuffer, 0, 1<<30)
	if err != nil {
		return err
	}
	data, err := filepath.Abs(f.data)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(data, 0o755); err != nil {
		return fmt.Errorf("--data: %w", err)
	}
	// One serve per data directory, and its address bound, before it
	// opens, starts or re-adopts anything there: a second serve would
	// take over (and stop) the first one's runtimes.
	unlock, err := lockData(data)
	if err != nil {
		return err
	}
	defer unlock()
	ln, err := server.Listen(f.listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	if f.bucketURL == "" {
		f.bucketURL = "file://" + filepath.Join(data, "bucket")
		if err := os.MkdirAll(filepath.Join(data, "bucket"), 0o755); err != nil {
			return err
		}
	}
	st, err := store.OpenState(ctx, f.fleet.state, data)
	if err != nil {
		return fmt.Errorf("--state: %w", err)
	}
	defer st.Close()
	b, err := bucket.Open(ctx, f.bucketURL, f.s3.options())
	if err != nil {
		return err
	}
	fs, err := openFiles(ctx, f, data, st)
	if err != nil {
		return err
	}
	slots, err := runtime.PlanSlots(f.slots, 0, 0, f.spot.slots)
	if err != nil {
		return fmt.Errorf("--slots/--spot-slots: %w", err)
	}
	if f.goMaxProcs < 0 {
		return fmt.Errorf("--gomaxprocs must not be negative, got %d", f.goMaxProcs)
	}
	if f.goMaxProcs > 0 {
		// Set here, not through $GOMAXPROCS, which the runtimes would inherit.
		goruntime.GOMAXPROCS(f.goMaxProcs)
	}
	if f.maxLoras < 0 || f.maxLoRARank < 1 {
		return fmt.Errorf("--max-loras must not be negative and --max-lora-rank must be positive, got %d and %d", f.maxLoras, f.maxLoRARank)
	}
	if f.speculativeConfig != "" {
		if _, err := server.ParseSpeculativeConfig(f.speculativeConfig); err != nil {
			return fmt.Errorf("--speculative-config: %w", err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	adminKey, err := f.auth.adminKey()
	if err != nil {
		return err
	}
	late := &lateController{st: st}
	limits, err := f.fleet.redis()
	if err != nil {
		return err
	}
	if limits != nil {
		defer limits.Close()
	}
	var refresh time.Duration
	if f.fleet.state != "" { // other gateways change keys and limits too
		refresh = sharedRefresh
	}
	tenants, err := tenancy.New(ctx, tenancy.Options{Store: st, AdminKey: adminKey, RecordUsage: !f.noUsage, Registerer: reg, Redis: limits, Refresh: refresh,
		Price: func(model string) config.Price {
			_, spec, _ := late.Lookup(model)
			return spec.Price
		}})
	if err != nil {
		return err
	}
	authMode, adminOpen, err := f.auth.resolve(f.listen, tenants)
	if err != nil {
		return err
	}

	if f.routing != "prefix" && f.routing != "least-inflight" {
		return fmt.Errorf("--routing: %q is not prefix or least-inflight", f.routing)
	}
	act := activator.New(activator.Options{Resolver: late, LeastInFlight: f.routing == "least-inflight", Registerer: reg, AdapterSlots: f.maxLoras,
		StreamWriteTimeout: f.limits.streamWrite, Authorize: tenancy.AuthorizeModel, Admit: tenants.Admit, CallerOf: tenants.CallerOf})
	routes, err := newRouteBook(ctx, f.routesFile, act, st)
	if err != nil {
		return err
	}
	batches, err := batch.New(batch.Options{Store: st, Files: fs, Dispatcher: act, Models: late, Windows: f.batchWindows,
		MaxInFlight: f.batchInFlight, LatencyTolerance: f.batchTolerance, Priority: activator.PriorityBatch, Registerer: reg,
		AsOwner: func(ctx context.Context, owner string) context.Context {
			if owner == "" {
				return ctx
			}
			return tenancy.WithPrincipal(ctx, tenancy.Principal{TenantID: owner})
		}})
	if err != nil {
		return fmt.Errorf("batch flags: %w", err)
	}

	hs := &http.Server{Handler: api.New(api.Options{Inference: act, Deployments: late, Runtimes: late.runtimesHandler(), Registry: reg, ColdStarts: late, Files: fs, Batches: batches,
		Tenancy: tenants, Auth: authMode, AdminOpen: adminOpen, Routes: routes}),
		ReadHeaderTimeout: f.limits.headerTimeout(), ReadTimeout: f.limits.read, IdleTimeout: f.limits.idle}
	ln = limitListener(ln, f.limits.maxConns, f.limits.maxConnsPerClient, int(sendBuffer))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go sweepFiles(runCtx, fs)
	go tenants.Run(runCtx)
	control := &controlPlane{f: f, data: data, slots: slots, sleepBudget: sleepBudget, arena: arena, cacheMax: cacheMax,
		st: st, bucket: b, act: act, batches: batches, late: late, reg: reg}
	errc := make(chan error, 2)
	if f.fleet.leaderElect {
		go func() { errc <- f.fleet.run(runCtx, &f.runtime.kube, st, act, late, control) }()
	} else if err := control.start(runCtx, act); err != nil {
		return err
	}
	defer control.stop()
	go func() { errc <- hs.Serve(ln) }()
	slog.Info("stoke serving", "addr", f.listen, "bucket", f.bucketURL, "data", data, "slots", len(slots), "warm", f.warm)
	select {
	case err := <-errc:
		stop()
		return err
	case <-ctx.Done():
	}
	slog.Info("draining", "timeout", f.drain)
	dctx, cancel := context.WithTimeout(context.Background(), f.drain)
	defer cancel()
	err = hs.Shutdown(dctx)
	stop()
	control.wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// openFiles opens the /v1/files store: content in --files (default
// file://DATA/files, spooled through DATA/spool on the way to s3://),
// metadata in the state store.
func openFiles(ctx context.Context, f serveFlags, data string, st *store.Store) (*files.Store, error) {
	url := f.filesURL
	if url == "" {
		url = "file://" + filepath.Join(data, "files")
	}
	spool := filepath.Join(data, "spool")
	if err := os.MkdirAll(spool, 0o755); err != nil {
		return nil, fmt.Errorf("--files: %w", err)
	}
	b, err := bucket.Open(ctx, url, f.s3.options())
	if err != nil {
		return nil, fmt.Errorf("--files: %w", err)
	}
	return files.New(files.Options{Blobs: b, Meta: st, SpoolDir: spool})
}

// sweepFiles deletes, once at start, the uploads a crash left unrecorded
// (an hour old at least, so that another gateway's uploads in flight are
// spared).
func sweepFiles(ctx context.Context, fs *files.Store) {
	n, err := fs.Sweep(ctx, time.Hour)
	if err != nil && ctx.Err() == nil {
		slog.Warn("sweep unrecorded uploads", "err", err)
	} else if n > 0 {
		slog.Info("swept unrecorded uploads", "blobs", n)
	}
}

// lockData takes the data directory for this process: an exclusive
// flock on DATA/lock, which then holds its pid. The lock goes with the
// process, however it ends (kill -9 included); the runtimes it starts do
// not inherit it (Go opens files close-on-exec).
func lockData(data string) (unlock func(), err error) {
	path := filepath.Join(data, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(holder))
			if pid == "" {
				pid = "unknown"
			}
			return nil, fmt.Errorf("data directory %s is in use by another stoke serve (pid %s); stop it, or give this one another --data", data, pid)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// lateController lets the activator, the API and the runtime manager,
// built before the controller they report to, reach it once it exists
// (they call it from their own goroutines while serve sets it); until
// then, on a gateway that follows a leader, the follower answers what it
// can from the shared state, and changes only the leader makes are
// refused.
type lateController struct {
	c  atomic.Pointer[reconcile.Controller]
	m  atomic.Pointer[runtime.Manager]
	f  atomic.Pointer[fleet.Follower]
	st *store.Store
}

func (l *lateController) set(c *reconcile.Controller) { l.c.Store(c) }

func (l *lateController) Lookup(name string) (string, config.Spec, bool) {
	if c := l.c.Load(); c != nil {
		return c.Lookup(name)
	}
	if f := l.follower(); f != nil {
		return f.Lookup(name)
	}
	return "", config.Spec{}, false
}

// Failed implements activator.FailedResolver.
func (l *lateController) Failed(name string) (string, bool) {
	c := l.c.Load()
	if c == nil {
		return "", false
	}
	return c.Failed(name)
}

// Known reports whether name is a deployment (the batch runner's check
// of its lines' models).
func (l *lateController) Known(name string) bool {
	_, _, ok := l.Lookup(name)
	return ok
}

func (l *lateController) Poke(name string) {
	if c := l.c.Load(); c != nil {
		c.Poke(name)
	} else if f := l.follower(); f != nil {
		f.Poke(name)
	}
}

// Refresh implements activator.RefreshingResolver: a follower reads the
// shared state now; the leader's view is the state, so it has nothing to
// refresh.
func (l *lateController) Refresh(ctx context.Context) {
	if l.c.Load() == nil {
		if f := l.follower(); f != nil {
			f.Refresh(ctx)
		}
	}
}

func (l *lateController) onRuntimeEvent(e runtime.Event) {
	if c := l.c.Load(); c != nil {
		go c.OnRuntimeEvent(e)
	}
}
