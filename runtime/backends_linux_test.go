//go:build linux

package runtime_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/stokehq/stoke/images"
	"github.com/stokehq/stoke/runtime/container"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
)

func init() {
	backends["containerd"] = func(t testing.TB, n *node, bin string) {
		socket := ctrdtest.StartWithRuntime(t)
		ctx := context.Background()
		res, err := images.Build(ctx, images.Options{Binary: bin, Out: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		imported, err := images.ImportArchive(ctx, res.Archives[images.EngineImage], images.ImportOptions{Socket: socket, Namespace: "stoke"})
		if err != nil {
			t.Fatal(err)
		}
		binds := []string{filepath.Join(n.dir, "cache")}
		if root, ok := strings.CutPrefix(n.source, "file://"); ok {
			binds = append(binds, root)
		}
		views := filepath.Join(n.dir, "views")
		be, err := container.New(ctx, container.Options{Socket: socket, Image: imported[0].Name, Snapshotter: imported[0].Snapshotter, Dir: n.dir,
			Binds: binds, Env: os.Environ(), Views: views})
		if err != nil {
			t.Fatal(err)
		}
		client, err := containerd.New(socket)
		if err != nil {
			t.Fatal(err)
		}
		// Registered after the daemon's: runs before it stops.
		t.Cleanup(func() {
			cctx := namespaces.WithNamespace(ctx, "stoke")
			if cs, err := client.Containers(cctx); err != nil || len(cs) != 0 {
				t.Errorf("%d containers left at the end (%v)", len(cs), err)
			}
			client.Close()
			be.Close()
		})
		cache, err := ctrdcache.New(ctx, ctrdcache.Options{Socket: socket, MountDir: views})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cache.Close() })
		n.cache = cache
		n.mounts = func() []string {
			ms, err := ctrdtest.MountsUnder(views)
			if err != nil {
				t.Fatal(err)
			}
			return slices.DeleteFunc(ms, func(m string) bool { return m == views })
		}
		n.limits = func(t testing.TB, memory int64, cpus float64) {
			cctx := namespaces.WithNamespace(ctx, "stoke")
			cs, err := client.Containers(cctx)
			if err != nil || len(cs) == 0 {
				t.Fatalf("no containers to check (%v)", err)
			}
			for _, c := range cs {
				spec, err := c.Spec(cctx)
				if err != nil {
					t.Fatal(err)
				}
				r := spec.Linux.Resources
				if r == nil || r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit != memory ||
					r.CPU == nil || r.CPU.Quota == nil || r.CPU.Period == nil || float64(*r.CPU.Quota)/float64(*r.CPU.Period) != cpus {
					t.Fatalf("container %s resources %+v, want %d bytes and %.1f CPUs", c.ID(), r, memory, cpus)
				}
			}
		}
		n.backend = be
		n.engines = func(t testing.TB) []int {
			cctx := namespaces.WithNamespace(ctx, "stoke")
			cs, err := client.Containers(cctx)
			if err != nil {
				t.Fatal(err)
			}
			var pids []int
			for _, c := range cs {
				task, err := c.Task(cctx, nil)
				if err != nil {
					continue // being removed
				}
				if st, err := task.Status(cctx); err == nil && st.Status == containerd.Running {
					pids = append(pids, int(task.Pid()))
				}
			}
			return pids
		}
	}
}
