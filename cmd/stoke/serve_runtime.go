package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/stokehq/stoke/images"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/runtime/container"
	"github.com/stokehq/stoke/runtime/process"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache"
)

// runtimeFlags choose how serve runs its engine runtimes: as child
// processes, as containers of the engine image under containerd, or as
// pods of it on Kubernetes.
type runtimeFlags struct {
	backend, socket, image, snapshotter string
	kube                                kubeFlags
}

func (r *runtimeFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&r.backend, "runtime", "process", "how engine runtimes run: process (child processes), containerd (runc containers of the engine image, weights from committed snapshots) or kubernetes (pods of the engine image)")
	fl.StringVar(&r.socket, "containerd-socket", defaultContainerdSocket, "containerd's socket, with --runtime containerd")
	fl.StringVar(&r.image, "engine-image", images.DefaultRepository+"/"+images.EngineImage+":"+images.DefaultTag,
		"the engine image runtimes run, with --runtime containerd (`stoke images build --import` puts it there) or kubernetes")
	fl.StringVar(&r.snapshotter, "snapshotter", "", "snapshotter the engine image is unpacked into, with --runtime containerd (default: the one that has it)")
	r.kube.add(fl)
}

// kubeOnly are the flags that apply only with --runtime kubernetes.
var kubeOnly = []string{"kube-install", "kube-image-pull-policy", "kube-engine-cpu", "kube-engine-memory", "kube-engine-gpus",
	"kube-node-selector", "kube-tolerations", "kube-spot-node-selector", "kube-spot-tolerations",
	"kube-priority-class-interactive", "kube-priority-class-batch", "kube-cache-path", "kube-s3-secret"}

// check refuses flags that cannot work together, before serve starts anything.
func (r *runtimeFlags) check(fl *pflag.FlagSet) error {
	only := func(names []string, backends string) error {
		for _, name := range names {
			if fl.Changed(name) {
				return fmt.Errorf("--%s applies only with --runtime %s", name, backends)
			}
		}
		return nil
	}
	switch r.backend {
	case "process":
		if err := only([]string{"containerd-socket", "engine-image", "snapshotter"}, "containerd or kubernetes"); err != nil {
			return err
		}
		return only(kubeOnly, "kubernetes")
	case "containerd":
		return only(kubeOnly, "kubernetes")
	case "kubernetes":
		return only([]string{"containerd-socket", "snapshotter"}, "containerd")
	}
	return fmt.Errorf("--runtime: %q is not process, containerd or kubernetes", r.backend)
}

// servedCache is the node cache serve's runtime manager loads revisions
// through, and the cold-start bench prepares tiers with.
type servedCache interface {
	nodecache.Cache
	Remove(ctx context.Context, revision string) error
}

// nodeRuntime is how this node runs engines: the backend that starts
// them and the node cache their weights come from. The runtime manager
// owns both: it alone decides whether a load reads the cache (t2) or the
// bucket (t3), and it alone fills the cache.
type nodeRuntime struct {
	backend runtime.Backend
	cache   servedCache
	close   func()
	// cluster: the runtimes are a cluster's pods, on capacity other work
	// shares and under another gateway after this one: blank ones beyond
	// the warm pool are deleted, and all outlive this serve, for the next
	// leader to adopt.
	cluster bool
}

// openNodeRuntime builds the backend and node cache of --runtime: the
// process backend with a directory cache under data, the containerd
// backend with the cache in containerd's content store, each revision a
// committed snapshot mounted read-only into the containers that load it,
// or the kubernetes backend, whose engines keep their node cache on their
// own node (--kube-cache-path) and load from the bucket through it.
func openNodeRuntime(ctx context.Context, r runtimeFlags, data, rtDir, bucketURL string, cacheMax int64) (*nodeRuntime, error) {
	cacheDir := filepath.Join(data, "cache")
	if r.backend == "process" {
		be, err := process.New(process.Options{Dir: rtDir})
		if err != nil {
			return nil, err
		}
		cache, err := nodecache.NewDir(cacheDir, nodecache.DirOptions{MaxBytes: cacheMax})
		if err != nil {
			return nil, fmt.Errorf("node cache: %w", err)
		}
		return &nodeRuntime{backend: be, cache: cache, close: func() {}}, nil
	}
	var binds []string
	if root, ok := strings.CutPrefix(bucketURL, "file://"); ok {
		binds = append(binds, root)
	}
	if r.backend == "kubernetes" {
		// The engines' node cache is theirs, on their node: the
		// gateway has none to fill or read.
		be, err := r.kube.openKubernetes(ctx, r.image, binds)
		if err != nil {
			return nil, err
		}
		return &nodeRuntime{backend: be, close: func() { be.Close() }, cluster: true}, nil
	}
	if _, err := os.Stat(r.socket); err != nil {
		return nil, fmt.Errorf("--containerd-socket: is containerd running? %w", err)
	}
	views := filepath.Join(data, "views")
	if err := os.MkdirAll(views, 0o755); err != nil {
		return nil, err
	}
	cache, err := ctrdcache.New(ctx, ctrdcache.Options{Socket: r.socket, MountDir: views, MaxBytes: cacheMax})
	if err != nil {
		return nil, fmt.Errorf("node cache in containerd: %w", err)
	}
	be, err := container.New(ctx, container.Options{Socket: r.socket, Image: r.image, Snapshotter: r.snapshotter,
		Dir: rtDir, Binds: binds, Views: views, Env: awsEnv()})
	if err != nil {
		cache.Close()
		return nil, err
	}
	return &nodeRuntime{backend: be, cache: cache, close: func() { errors.Join(be.Close(), cache.Close()) }}, nil
}

// awsEnv is the part of serve's environment an engine in a container needs
// to read an s3:// bucket.
func awsEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	return env
}
