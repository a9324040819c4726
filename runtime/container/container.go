//go:build linux

// Package container is the containerd runtime backend: engine runtimes are
// containers (runc) from the engine image that package images builds, in
// the host's network namespace, with the runtimes' socket directory bind-
// mounted at /run/stoke and the node's weight paths (the cache directory,
// a file:// bucket) bind-mounted where the engine expects them. A container
// that exits is seen like a dead process; a restarted manager re-adopts
// running containers by their labels and removes the others.
package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/containerd/runtime/v2/runc/options"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/stokehq/stoke/runtime"
)

// Labels the backend puts on its containers.
const (
	labelRuntime = "stoke.runtime"
	labelSocket  = "stoke.socket"
)

// Paths inside the engine image (see package images).
const (
	binaryPath = "/usr/local/bin/stoke"
	socketDir  = "/run/stoke"
)

// Options configure the backend.
type Options struct {
	// Socket is containerd's socket; Namespace the namespace the
	// containers live in (default "stoke").
	Socket, Namespace string
	// Image is the engine image's reference, already imported and
	// unpacked into Snapshotter (default: overlayfs or native, the first
	// that holds the unpacked image).
	Image, Snapshotter string
	// Dir is the host directory of the runtimes' sockets and logs; it is
	// mounted at /run/stoke in every container.
	Dir string
	// Binds are host paths mounted at the same path in every container,
	// read-write (the node cache directory, a file:// bucket).
	Binds []string
	// Views is a host directory mounted at the same path in every
	// container with mounts propagating in: the node cache mounts
	// revisions' read-only snapshot views under it (ctrdcache's MountDir),
	// and running containers see them appear. The backend makes it a
	// shared mount point.
	Views string
	// Env is the containers' environment (AWS_* for s3:// sources).
	Env []string
	// RuncRoot keeps runc's state (default Dir/runc).
	RuncRoot string
	// Logger receives the backend's logs (slog.Default() when nil).
	Logger *slog.Logger
}

// Backend starts runtimes as containers.
type Backend struct {
	opts   Options
	client *containerd.Client
}

// New connects to containerd and checks that the image is there.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if opts.Namespace == "" {
		opts.Namespace = "stoke"
	}
	if opts.RuncRoot == "" {
		opts.RuncRoot = filepath.Join(opts.Dir, "runc")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Dir == "" || opts.Image == "" {
		return nil, errors.New("containerd backend: Options.Dir and Options.Image are required")
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("containerd backend: %w", err)
	}
	if _, err := os.Stat(opts.Socket); err != nil {
		return nil, fmt.Errorf("containerd backend: is containerd running? %w", err)
	}
	client, err := containerd.New(opts.Socket, containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("containerd backend: connect to %s: %w", opts.Socket, err)
	}
	b := &Backend{opts: opts, client: client}
	img, err := client.GetImage(b.ctx(ctx), opts.Image)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("containerd backend: image %s: %w (build and import it with `stoke images build --import`)", opts.Image, err)
	}
	if b.opts.Snapshotter == "" {
		for _, sn := range []string{"overlayfs", "native"} {
			if ok, err := img.IsUnpacked(b.ctx(ctx), sn); err == nil && ok {
				b.opts.Snapshotter = sn
				break
			}
		}
		if b.opts.Snapshotter == "" {
			client.Close()
			return nil, fmt.Errorf("containerd backend: image %s is not unpacked into overlayfs or native (import it with `stoke images build --import`)", opts.Image)
		}
	}
	if opts.Views != "" {
		if err := shareViews(opts.Views); err != nil {
			client.Close()
			return nil, fmt.Errorf("containerd backend: %w", err)
		}
	}
	return b, nil
}

// shareViews makes dir a mount point whose submounts propagate to the
// containers that bind it.
func shareViews(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// A backend of a manager that was killed left its mount point: take
	// it over rather than stack another on it.
	if mounted, err := mountinfo.Mounted(dir); err != nil {
		return fmt.Errorf("is %s a mount point: %w", dir, err)
	} else if mounted {
		return unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// Close disconnects from containerd and unmounts the views directory; the
// containers keep running.
func (b *Backend) Close() error {
	if b.opts.Views != "" {
		unix.Unmount(b.opts.Views, unix.MNT_DETACH)
	}
	return b.client.Close()
}

// Name implements runtime.Backend.
func (*Backend) Name() string { return "containerd" }

func (b *Backend) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, b.opts.Namespace)
}

// Start implements runtime.Backend.
func (b *Backend) Start(ctx context.Context, spec runtime.Spec) (runtime.Process, error) {
	ctx = b.ctx(ctx)
	if filepath.Dir(spec.Socket) != filepath.Clean(b.opts.Dir) {
		return nil, fmt.Errorf("start runtime %s: socket %s is not in %s", spec.ID, spec.Socket, b.opts.Dir)
	}
	image, err := b.client.GetImage(ctx, b.opts.Image)
	if err != nil {
		return nil, fmt.Errorf("start runtime %s: image %s: %w", spec.ID, b.opts.Image, err)
	}
	os.Remove(spec.Socket)
	// The engine writes (and rotates) its log in the runtimes' directory,
	// the same file containerd copies its standard output and error to.
	args := append([]string{binaryPath, "engine", "--blank", "--listen", "unix://" + filepath.Join(socketDir, filepath.Base(spec.Socket)),
		"--log-file", filepath.Join(socketDir, spec.ID+".log")}, spec.EngineArgs...)
	mounts := []specs.Mount{{Type: "bind", Source: b.opts.Dir, Destination: socketDir, Options: []string{"rbind", "rw"}}}
	if b.opts.Views != "" {
		mounts = append(mounts, specs.Mount{Type: "bind", Source: b.opts.Views, Destination: b.opts.Views, Options: []string{"rbind", "rslave"}})
	}
	for _, p := range b.opts.Binds {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, fmt.Errorf("start runtime %s: %w", spec.ID, err)
		}
		mounts = append(mounts, specs.Mount{Type: "bind", Source: p, Destination: p, Options: []string{"rbind", "rw"}})
	}
	specOpts := []oci.SpecOpts{
		oci.WithImageConfig(image),
		oci.WithProcessArgs(args...),
		oci.WithEnv(b.opts.Env),
		oci.WithHostNamespace(specs.NetworkNamespace),
		oci.WithHostResolvconf,
		// A cgroup of its own at the top, which runc removes with the
		// container.
		oci.WithCgroup("/" + b.opts.Namespace + "-" + spec.ID),
		oci.WithMounts(mounts),
	}
	if spec.MemoryBytes > 0 {
		specOpts = append(specOpts, oci.WithMemoryLimit(uint64(spec.MemoryBytes)))
	}
	if spec.CPUs > 0 {
		const period = 100000
		specOpts = append(specOpts, oci.WithCPUCFS(int64(spec.CPUs*period), period))
	}
	c, err := b.client.NewContainer(ctx, spec.ID,
		containerd.WithImage(image),
		containerd.WithSnapshotter(b.opts.Snapshotter),
		containerd.WithNewSnapshot(spec.ID, image),
		containerd.WithRuntime(plugin.RuntimeRuncV2, &options.Options{Root: b.opts.RuncRoot}),
		containerd.WithContainerLabels(map[string]string{labelRuntime: spec.ID, labelSocket: spec.Socket}),
		containerd.WithNewSpec(specOpts...),
	)
	if err != nil {
		return nil, fmt.Errorf("start runtime %s: create container: %w", spec.ID, err)
	}
	task, err := c.NewTask(ctx, cio.LogFile(filepath.Join(b.opts.Dir, spec.ID+".log")))
	if err != nil {
		b.remove(ctx, c)
		return nil, fmt.Errorf("start runtime %s: create task: %w", spec.ID, err)
	}
	p, err := b.watch(c, task, spec.Socket)
	if err != nil {
		b.remove(ctx, c)
		return nil, fmt.Errorf("start runtime %s: %w", spec.ID, err)
	}
	if err := task.Start(ctx); err != nil {
		b.remove(ctx, c)
		return nil, fmt.Errorf("start runtime %s: start task: %w", spec.ID, err)
	}
	return p, nil
}

// watch returns the Process of a container's task, done when it exits.
func (b *Backend) watch(c containerd.Container, task containerd.Task, socket string) (*proc, error) {
	exited, err := task.Wait(b.ctx(context.Background()))
	if err != nil {
		return nil, fmt.Errorf("wait for task: %w", err)
	}
	p := &proc{b: b, c: c, task: task, socket: socket, done: make(chan struct{})}
	go func() {
		<-exited
		close(p.done)
	}()
	return p, nil
}

// Recover implements runtime.Backend: running containers of this backend
// are adopted, stopped ones removed.
func (b *Backend) Recover(ctx context.Context) ([]runtime.Process, error) {
	ctx = b.ctx(ctx)
	cs, err := b.client.Containers(ctx, fmt.Sprintf("labels.%q", labelRuntime))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var live []runtime.Process
	for _, c := range cs {
		labels, err := c.Labels(ctx)
		if err != nil {
			return nil, fmt.Errorf("labels of container %s: %w", c.ID(), err)
		}
		task, err := c.Task(ctx, nil)
		if err == nil {
			if st, err := task.Status(ctx); err == nil && st.Status == containerd.Running {
				if p, err := b.watch(c, task, labels[labelSocket]); err == nil {
					live = append(live, p)
					continue
				}
			}
		}
		b.opts.Logger.Info("removing a runtime container from an earlier run", "runtime", c.ID())
		b.remove(ctx, c)
		os.Remove(labels[labelSocket])
	}
	return live, nil
}

// remove kills a container's task, if any, and deletes the container and
// its snapshot.
func (b *Backend) remove(ctx context.Context, c containerd.Container) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	if task, err := c.Task(ctx, nil); err == nil {
		task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task of %s: %w", c.ID(), err)
		}
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container %s: %w", c.ID(), err)
	}
	return nil
}

// proc is a runtime container.
type proc struct {
	b      *Backend
	c      containerd.Container
	task   containerd.Task
	socket string
	done   chan struct{}
}

func (p *proc) ID() string            { return p.c.ID() }
func (p *proc) Addr() string          { return "unix://" + p.socket }
func (p *proc) Done() <-chan struct{} { return p.done }

// PID is the engine's process id on the host.
func (p *proc) PID() int { return int(p.task.Pid()) }

func (p *proc) Stop(ctx context.Context, grace time.Duration) error {
	ctx = p.b.ctx(ctx)
	select {
	case <-p.done:
	default:
		p.task.Kill(ctx, syscall.SIGTERM)
		t := time.NewTimer(grace)
		select {
		case <-p.done:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	err := p.b.remove(ctx, p.c)
	os.Remove(p.socket)
	return err
}
