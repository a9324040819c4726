//go:build linux

package ctrdcache

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/go-digest"

	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
)

// testTimeout bounds each containerd operation of a test.
const testTimeout = time.Minute

// Environment of the helper process that TestHelperProcess runs.
const (
	envHelper   = "STOKE_CTRDCACHE_HELPER" // the mode
	envSocket   = "STOKE_CTRDCACHE_SOCKET"
	envMountDir = "STOKE_CTRDCACHE_MOUNTDIR"
	envArg      = "STOKE_CTRDCACHE_ARG"
)

// env is one private containerd and the mount directory its caches use.
type env struct {
	socket   string
	mountDir string
}

// newEnv starts containerd and checks, when the test ends, that nothing
// stays mounted under the mount directory.
func newEnv(t *testing.T) env {
	t.Helper()
	e := env{socket: ctrdtest.Start(t), mountDir: t.TempDir()}
	t.Cleanup(func() {
		leaked, err := ctrdtest.MountsUnder(e.mountDir)
		if err != nil {
			t.Error(err)
		}
		if len(leaked) > 0 {
			t.Errorf("mounts left under %s: %v", e.mountDir, leaked)
			for _, m := range slices.Backward(leaked) {
				syscall.Unmount(m, syscall.MNT_DETACH)
			}
		}
	})
	return e
}

// open returns a new Cache on the environment's containerd, closed when
// the test ends.
func (e env) open(t testing.TB) *Cache {
	t.Helper()
	c, err := New(ctxT(t), Options{Socket: e.socket, Namespace: ctrdtest.Namespace, MountDir: e.mountDir})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// randomBytes returns n pseudo-random bytes determined by seed.
func randomBytes(seed uint64, n int) []byte {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	data := make([]byte, n)
	rand.NewChaCha8(key).Read(data)
	return data
}

func fileOf(name string, data []byte) manifest.File {
	sum := sha256.Sum256(data)
	return manifest.File{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
}

func manifestOf(model string, files ...manifest.File) *manifest.Manifest {
	m := &manifest.Manifest{Model: model, Files: files, DType: "BF16", CreatedAt: time.Unix(1700000000, 0).UTC()}
	for _, f := range files {
		m.TotalBytes += f.Size
	}
	m.Revision = manifest.Revision(files)
	return m
}

// ingest writes data as f's blob and commits it.
func ingest(t testing.TB, c *Cache, f manifest.File, data []byte) {
	t.Helper()
	ctx := ctxT(t)
	w, err := c.Create(ctx, f)
	if err != nil {
		t.Fatalf("Create %s: %v", f.Name, err)
	}
	defer w.Close()
	if _, err := w.Write(data); err != nil {
		t.Fatalf("Write %s: %v", f.Name, err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatalf("Commit %s: %v", f.Name, err)
	}
}

// ensure ingests f's blob unless it is committed already (the empty blob
// is shared by every subtest).
func ensure(t testing.TB, c *Cache, f manifest.File, data []byte) {
	t.Helper()
	if _, err := c.content.Info(c.ctx(ctxT(t)), digest.Digest("sha256:"+f.SHA256)); err == nil {
		return
	}
	ingest(t, c, f, data)
}

// readBlob opens f's blob and reads all of it.
func readBlob(ctx context.Context, c *Cache, f manifest.File) ([]byte, error) {
	b, err := c.Open(ctx, f)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	if b.Size() != f.Size {
		return nil, fmt.Errorf("Size() = %d, want %d", b.Size(), f.Size)
	}
	return io.ReadAll(io.NewSectionReader(b, 0, b.Size()))
}

func TestCache(t *testing.T) {
	e := newEnv(t)
	c := e.open(t)
	t.Logf("snapshotter %s", c.Snapshotter())

	t.Run("blobs", func(t *testing.T) {
		for i, size := range []int{0, 1, 1000, writeChunk + 7, 2*writeChunk + 1} {
			t.Run(fmt.Sprint(size), func(t *testing.T) {
				ctx := ctxT(t)
				data := randomBytes(uint64(100+i), size)
				f := fileOf("blob.bin", data)
				if _, err := c.Open(ctx, f); !errors.Is(err, nodecache.ErrNotExist) {
					t.Fatalf("Open before ingest: %v, want ErrNotExist", err)
				}
				ingest(t, c, f, data)
				got, err := readBlob(ctx, c, f)
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				if !bytes.Equal(got, data) {
					t.Fatalf("read %d bytes that differ from the %d ingested", len(got), len(data))
				}
				if _, err := c.Create(ctx, f); !errors.Is(err, nodecache.ErrExists) {
					t.Fatalf("Create of a committed blob: %v, want ErrExists", err)
				}
				wrong := f
				wrong.Size++
				if _, err := c.Open(ctx, wrong); !errors.Is(err, nodecache.ErrNotExist) {
					t.Fatalf("Open with the wrong size: %v, want ErrNotExist", err)
				}
			})
		}
	})

	t.Run("ReadAt", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(200, 5000)
		f := fileOf("r.bin", data)
		ingest(t, c, f, data)
		b, err := c.Open(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for _, tc := range []struct {
			off, n  int64
			wantN   int
			wantEOF bool
		}{
			{0, 10, 10, false},
			{4990, 10, 10, false},
			{4995, 10, 5, true},
			{5000, 10, 0, true},
			{7000, 1, 0, true},
		} {
			p := make([]byte, tc.n)
			n, err := b.ReadAt(p, tc.off)
			if n != tc.wantN || (err == io.EOF) != tc.wantEOF || (err != nil && err != io.EOF) {
				t.Errorf("ReadAt(%d bytes at %d) = %d, %v; want %d, EOF %v", tc.n, tc.off, n, err, tc.wantN, tc.wantEOF)
				continue
			}
			if n > 0 && !bytes.Equal(p[:n], data[tc.off:tc.off+int64(n)]) {
				t.Errorf("ReadAt(%d bytes at %d) returned other bytes", tc.n, tc.off)
			}
		}
		if _, err := b.ReadAt(make([]byte, 1), -1); err == nil {
			t.Error("ReadAt at -1 succeeded")
		}
	})

	t.Run("mismatch", func(t *testing.T) {
		for i, tc := range []struct {
			name  string
			write func(data []byte) []byte
		}{
			{"other bytes", func(d []byte) []byte { d = slices.Clone(d); d[len(d)/2] ^= 1; return d }},
			{"short", func(d []byte) []byte { return d[:len(d)-1] }},
			{"long", func(d []byte) []byte { return append(slices.Clone(d), 0) }},
			{"nothing", func(d []byte) []byte { return nil }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := ctxT(t)
				data := randomBytes(uint64(300+i), 4096)
				f := fileOf("m.bin", data)
				w, err := c.Create(ctx, f)
				if err != nil {
					t.Fatal(err)
				}
				_, werr := w.Write(tc.write(data))
				cerr := w.Commit(ctx)
				if !errors.Is(cerr, nodecache.ErrDigestMismatch) {
					t.Fatalf("Commit: %v (Write: %v), want ErrDigestMismatch", cerr, werr)
				}
				if err := w.Close(); err != nil {
					t.Fatalf("Close after a failed Commit: %v", err)
				}
				if _, err := c.Open(ctx, f); !errors.Is(err, nodecache.ErrNotExist) {
					t.Fatalf("Open after a mismatch: %v, want ErrNotExist", err)
				}
				ingest(t, c, f, data)
				if got, err := readBlob(ctx, c, f); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("after re-ingest: read %d bytes, %v", len(got), err)
				}
			})
		}
	})

	t.Run("abandoned writer", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(400, 3*writeChunk/2)
		f := fileOf("a.bin", data)
		w, err := c.Create(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data[:len(data)/2]); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := w.Commit(ctx); err == nil {
			t.Fatal("Commit after Close succeeded")
		}
		if _, err := c.Open(ctx, f); !errors.Is(err, nodecache.ErrNotExist) {
			t.Fatalf("Open after abandon: %v, want ErrNotExist", err)
		}
		ingest(t, c, f, data)
		if got, err := readBlob(ctx, c, f); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("after re-ingest: read %d bytes, %v", len(got), err)
		}
	})

	t.Run("second writer waits", func(t *testing.T) {
		for i, tc := range []struct {
			name       string
			staleAfter time.Duration // of the second writer's client
		}{
			// It sees the ingest busy and never asks for the lock.
			{"busy ingest", defaultStaleAfter},
			// It asks while the first writer holds the lock, is refused
			// and goes on waiting.
			{"idle holder", time.Millisecond},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := ctxT(t)
				data := randomBytes(uint64(500+i), 2*writeChunk)
				f := fileOf("w.bin", data)
				first, err := c.Create(ctx, f)
				if err != nil {
					t.Fatal(err)
				}
				defer first.Close()
				if _, err := first.Write(data[:len(data)/2]); err != nil {
					t.Fatal(err)
				}
				c2 := e.open(t)
				c2.staleAfter = tc.staleAfter
				second := make(chan error, 1)
				go func() {
					w, err := c2.Create(ctx, f)
					if err == nil {
						w.Close()
						err = errors.New("got a writer while the first one held the blob")
					}
					second <- err
				}()
				// The second writer leases the blob before it waits for the ref.
				waitFor(t, "the second writer to wait", func() (bool, error) {
					ls, err := c.leases.List(c.ctx(ctx), labelFilter(labelBlob, "sha256:"+f.SHA256))
					return len(ls) == 2, err
				})
				select {
				case err := <-second:
					t.Fatalf("second Create returned while the first writer was writing: %v", err)
				default:
				}
				if _, err := first.Write(data[len(data)/2:]); err != nil {
					t.Fatal(err)
				}
				if err := first.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-second; !errors.Is(err, nodecache.ErrExists) {
					t.Fatalf("second Create: %v, want ErrExists", err)
				}
			})
		}
	})

	t.Run("build lock", func(t *testing.T) {
		ctx := c.ctx(ctxT(t))
		ref := buildLockRef("sha256:" + strings.Repeat("0", 64))
		never := func(context.Context) (bool, error) { return false, nil }
		unlock, _, err := c.lock(ctx, ctx, ref, never)
		if err != nil {
			t.Fatal(err)
		}
		c2 := e.open(t)
		c2.staleAfter = 300 * time.Millisecond
		var released atomic.Bool
		acquired := make(chan error, 1)
		go func() {
			unlock2, _, err := c2.lock(ctx, ctx, ref, never)
			if err == nil {
				if !released.Load() {
					err = errors.New("took the lock while it was held")
				}
				unlock2()
			}
			acquired <- err
		}()
		// Hold it across heartbeats before releasing it.
		time.Sleep(heartbeatEvery + heartbeatEvery/2)
		released.Store(true)
		unlock()
		if err := <-acquired; err != nil {
			t.Fatalf("second lock: %v", err)
		}
		if _, err := c.content.Status(ctx, ref); !errdefs.IsNotFound(err) {
			t.Errorf("lock ingest after both unlocked: %v, want not found", err)
		}
	})

	t.Run("racing writers", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(600, writeChunk+123)
		f := fileOf("race.bin", data)
		const n = 4
		var wg sync.WaitGroup
		results := make([]error, n)
		ingested := make([]bool, n)
		for i := range n {
			wg.Go(func() {
				w, err := c.Create(ctx, f)
				if err != nil {
					results[i] = err
					return
				}
				defer w.Close()
				ingested[i] = true
				if _, err := w.Write(data); err != nil {
					results[i] = err
					return
				}
				results[i] = w.Commit(ctx)
			})
		}
		wg.Wait()
		writers := 0
		for i := range n {
			switch {
			case ingested[i] && results[i] == nil:
				writers++
			case !ingested[i] && errors.Is(results[i], nodecache.ErrExists):
			default:
				t.Errorf("writer %d: ingested %v, %v", i, ingested[i], results[i])
			}
		}
		if writers != 1 {
			t.Errorf("%d writers ingested the blob, want 1", writers)
		}
		if got, err := readBlob(ctx, c, f); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d bytes, %v", len(got), err)
		}
	})

	t.Run("revision", func(t *testing.T) {
		ctx := ctxT(t)
		weights := randomBytes(700, 3*writeChunk+5)
		config := []byte(`{"hidden_size": 64}`)
		files := []manifest.File{fileOf("model.safetensors", weights), fileOf("config.json", config), fileOf("empty.txt", nil), fileOf("copy.json", config)}
		contents := map[string][]byte{"model.safetensors": weights, "config.json": config, "empty.txt": {}, "copy.json": config}
		for _, f := range files[:3] {
			ensure(t, c, f, contents[f.Name])
		}
		m := manifestOf("tiny", files...)
		if _, err := c.OpenRevision(ctx, m.Revision); !errors.Is(err, nodecache.ErrNotExist) {
			t.Fatalf("OpenRevision before commit: %v, want ErrNotExist", err)
		}
		for i := range 2 {
			if err := c.CommitRevision(ctx, m); err != nil {
				t.Fatalf("CommitRevision #%d: %v", i+1, err)
			}
		}
		r1, err := c.OpenRevision(ctx, m.Revision)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := c.OpenRevision(ctx, m.Revision)
		if err != nil {
			t.Fatal(err)
		}
		if r1.Dir() == r2.Dir() {
			t.Errorf("two views share %s", r1.Dir())
		}
		for _, r := range []nodecache.Revision{r1, r2} {
			checkRevisionDir(t, r, m, contents)
		}
		for _, r := range []nodecache.Revision{r1, r2} {
			dir := r.Dir()
			if err := r.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := r.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("view directory %s after Close: %v", dir, err)
			}
		}
		if _, err := c.snapshots.Stat(c.ctx(ctx), buildKey(m.Revision)); !errdefs.IsNotFound(err) {
			t.Errorf("build snapshot after commit: %v, want not found", err)
		}
	})

	t.Run("racing builders", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(750, 2*writeChunk)
		f := fileOf("race.safetensors", data)
		ingest(t, c, f, data)
		m := manifestOf("race", f)
		const n = 4
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			// Half use their own client, as other processes would.
			cc := c
			if i%2 == 1 {
				cc = e.open(t)
			}
			wg.Go(func() { errs[i] = cc.CommitRevision(ctx, m) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("builder %d: %v", i, err)
			}
		}
		r, err := c.OpenRevision(ctx, m.Revision)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		checkRevisionDir(t, r, m, map[string][]byte{f.Name: data})
	})

	t.Run("revision with a missing blob", func(t *testing.T) {
		ctx := ctxT(t)
		have, missing := randomBytes(800, 100), randomBytes(801, 100)
		fh, fm := fileOf("have.bin", have), fileOf("missing.bin", missing)
		ingest(t, c, fh, have)
		m := manifestOf("missing", fh, fm)
		err := c.CommitRevision(ctx, m)
		if !errors.Is(err, nodecache.ErrNotExist) || !strings.Contains(err.Error(), "missing.bin") {
			t.Fatalf("CommitRevision: %v, want ErrNotExist naming missing.bin", err)
		}
		if _, err := c.OpenRevision(ctx, m.Revision); !errors.Is(err, nodecache.ErrNotExist) {
			t.Fatalf("OpenRevision: %v, want ErrNotExist", err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		ctx := ctxT(t)
		bad := manifestOf("bad", fileOf("x", []byte("x")))
		bad.TotalBytes++
		for name, err := range map[string]error{
			"Open bad digest":         errOf(c.Open(ctx, manifest.File{Name: "x", SHA256: "ABC"})),
			"Create negative size":    errOf(c.Create(ctx, manifest.File{Name: "x", Size: -1, SHA256: strings.Repeat("a", 64)})),
			"CommitRevision nil":      c.CommitRevision(ctx, nil),
			"CommitRevision invalid":  c.CommitRevision(ctx, bad),
			"OpenRevision bad digest": errOf(c.OpenRevision(ctx, "sha256:xyz")),
			"OpenRevision no prefix":  errOf(c.OpenRevision(ctx, strings.Repeat("a", 64))),
			"Remove bad digest":       c.Remove(ctx, "md5:00"),
		} {
			if err == nil || errors.Is(err, nodecache.ErrNotExist) {
				t.Errorf("%s: %v, want an error other than ErrNotExist", name, err)
			}
		}
	})

	t.Run("stale build", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(900, 1000)
		f := fileOf("s.bin", data)
		ingest(t, c, f, data)
		m := manifestOf("stale", f)
		// What a builder killed mid-copy leaves: its lease and active
		// snapshot, mounted, with a partial file.
		dir, err := os.MkdirTemp(e.mountDir, buildDirPrefix)
		if err != nil {
			t.Fatal(err)
		}
		lease, err := c.leases.Create(c.ctx(ctx), leases.WithRandomID(), leases.WithLabels(map[string]string{labelBuild: m.Revision}))
		if err != nil {
			t.Fatal(err)
		}
		lctx := leases.WithLease(c.ctx(ctx), lease.ID)
		mounts, err := c.snapshots.Prepare(lctx, buildKey(m.Revision), "", snapshots.WithLabels(map[string]string{labelMount: dir}))
		if err != nil {
			t.Fatal(err)
		}
		if err := mount.All(mounts, dir); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.Name), data[:10], 0o444); err != nil {
			t.Fatal(err)
		}
		if _, err := c.OpenRevision(ctx, m.Revision); !errors.Is(err, nodecache.ErrNotExist) {
			t.Fatalf("OpenRevision of a half-built revision: %v, want ErrNotExist", err)
		}
		if err := c.CommitRevision(ctx, m); err != nil {
			t.Fatal(err)
		}
		if leaked, _ := ctrdtest.MountsUnder(dir); len(leaked) > 0 {
			t.Errorf("stale build mount %v not removed", leaked)
		}
		r, err := c.OpenRevision(ctx, m.Revision)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		checkRevisionDir(t, r, m, map[string][]byte{f.Name: data})
	})

	t.Run("restart", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(1000, 2000)
		f := fileOf("restart.bin", data)
		ingest(t, c, f, data)
		m := manifestOf("restart", f)
		if err := c.CommitRevision(ctx, m); err != nil {
			t.Fatal(err)
		}
		c2, err := New(ctx, Options{Socket: e.socket, Namespace: ctrdtest.Namespace, MountDir: e.mountDir})
		if err != nil {
			t.Fatal(err)
		}
		if err := c2.Close(); err != nil {
			t.Fatal(err)
		}
		c3 := e.open(t)
		r, err := c3.OpenRevision(ctx, m.Revision)
		if err != nil {
			t.Fatalf("OpenRevision from a new client: %v", err)
		}
		checkRevisionDir(t, r, m, map[string][]byte{f.Name: data})
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if got, err := readBlob(ctx, c3, f); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("blob from a new client: %d bytes, %v", len(got), err)
		}
	})

	t.Run("remove", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(1100, 3000)
		f := fileOf("rm.bin", data)
		ingest(t, c, f, data)
		m := manifestOf("rm", f)
		if err := c.CommitRevision(ctx, m); err != nil {
			t.Fatal(err)
		}
		r, err := c.OpenRevision(ctx, m.Revision)
		if err != nil {
			t.Fatal(err)
		}
		if info := findRevision(t, c, m.Revision); info == nil || info.Views != 1 || info.Bytes != m.TotalBytes || info.Model != "rm" {
			t.Fatalf("Revisions lists %+v, want 1 view, %d bytes, model rm", info, m.TotalBytes)
		}
		if err := c.Remove(ctx, m.Revision); !errors.Is(err, ErrInUse) {
			t.Fatalf("Remove with an open view: %v, want ErrInUse", err)
		}
		checkRevisionDir(t, r, m, map[string][]byte{f.Name: data})
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Remove(ctx, m.Revision); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		if _, err := c.OpenRevision(ctx, m.Revision); !errors.Is(err, nodecache.ErrNotExist) {
			t.Fatalf("OpenRevision after Remove: %v, want ErrNotExist", err)
		}
		if err := c.Remove(ctx, m.Revision); !errors.Is(err, nodecache.ErrNotExist) {
			t.Fatalf("second Remove: %v, want ErrNotExist", err)
		}
		if info := findRevision(t, c, m.Revision); info != nil {
			t.Fatalf("Revisions still lists %+v", info)
		}
		if ls, err := c.leases.List(c.ctx(ctx), labelFilter(labelBlob, "sha256:"+f.SHA256)); err != nil || len(ls) != 0 {
			t.Fatalf("blob leases after Remove: %v, %v; want none", ls, err)
		}
	})

	t.Run("trim", func(t *testing.T) {
		ctx := ctxT(t)
		// Start from an empty cache so that the budget counts only these.
		revs, err := c.Revisions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range revs {
			if err := c.Remove(ctx, r.Revision); err != nil {
				t.Fatal(err)
			}
		}
		var ms []*manifest.Manifest
		for i := range 3 {
			data := randomBytes(uint64(1200+i), 1000)
			f := fileOf("t.bin", data)
			ingest(t, c, f, data)
			m := manifestOf(fmt.Sprintf("trim%d", i), f)
			if err := c.CommitRevision(ctx, m); err != nil {
				t.Fatal(err)
			}
			ms = append(ms, m)
		}
		// Use order: 1, 0, 2 (2 stays open), so 1 is the least recent.
		for _, i := range []int{1, 0} {
			r, err := c.OpenRevision(ctx, ms[i].Revision)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}
		open, err := c.OpenRevision(ctx, ms[2].Revision)
		if err != nil {
			t.Fatal(err)
		}
		defer open.Close()
		removed, err := c.Trim(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{ms[1].Revision, ms[0].Revision}
		if !slices.Equal(removed, want) {
			t.Fatalf("Trim removed %v, want %v (least recently used first, not the open one)", removed, want)
		}
		if findRevision(t, c, ms[2].Revision) == nil {
			t.Fatal("Trim removed the open revision")
		}
	})
}

func errOf[T any](_ T, err error) error { return err }

// checkRevisionDir checks that r's directory holds exactly m's files with
// the given contents and manifest.json, and is read-only.
func checkRevisionDir(t *testing.T, r nodecache.Revision, m *manifest.Manifest, contents map[string][]byte) {
	t.Helper()
	dir := r.Dir()
	if got := r.Manifest(); got.Revision != m.Revision || !slices.Equal(got.Files, m.Files) {
		t.Fatalf("Manifest() = %+v, want %+v", got, m)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	wantNames := []string{manifest.FileName}
	for _, f := range m.Files {
		wantNames = append(wantNames, f.Name)
	}
	slices.Sort(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Fatalf("%s holds %v, want %v", dir, names, wantNames)
	}
	for _, f := range m.Files {
		got, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, contents[f.Name]) {
			t.Fatalf("%s: %d bytes that differ from the %d ingested", f.Name, len(got), len(contents[f.Name]))
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := manifest.Parse(data); err != nil || got.Revision != m.Revision {
		t.Fatalf("manifest.json: %v, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("creating a file in the view: %v, want EROFS", err)
	}
	if f, err := os.OpenFile(filepath.Join(dir, m.Files[0].Name), os.O_WRONLY, 0); !errors.Is(err, syscall.EROFS) {
		if err == nil {
			f.Close()
		}
		t.Errorf("opening %s for writing: %v, want EROFS", m.Files[0].Name, err)
	}
}

func findRevision(t *testing.T, c *Cache, revision string) *RevisionInfo {
	t.Helper()
	revs, err := c.Revisions(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range revs {
		if revs[i].Revision == revision {
			return &revs[i]
		}
	}
	return nil
}

// waitFor polls cond until it holds, failing the test after testTimeout.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %v", what, testTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKilled kills processes that hold cache resources and checks that
// what they leave is not mistaken for committed content and is reclaimed.
func TestKilled(t *testing.T) {
	e := newEnv(t)
	c := e.open(t)
	// Take over a dead writer's ingest soon (the default waits longer so
	// that a live writer that pauses is not disturbed).
	c.staleAfter = 200 * time.Millisecond

	t.Run("writer", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(2000, 3*writeChunk)
		f := fileOf("killed.bin", data)
		runAndKill(t, e, "half-writer", "2000")
		if _, err := c.Open(ctx, f); !errors.Is(err, nodecache.ErrNotExist) {
			t.Fatalf("Open after the writer was killed: %v, want ErrNotExist", err)
		}
		ingest(t, c, f, data)
		if got, err := readBlob(ctx, c, f); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("after re-ingest: %d bytes, %v", len(got), err)
		}
	})

	t.Run("view", func(t *testing.T) {
		ctx := ctxT(t)
		data := randomBytes(2100, 1000)
		f := fileOf("v.bin", data)
		ingest(t, c, f, data)
		m := manifestOf("view", f)
		if err := c.CommitRevision(ctx, m); err != nil {
			t.Fatal(err)
		}
		dir := runAndKill(t, e, "view", m.Revision)
		if leaked, _ := ctrdtest.MountsUnder(dir); len(leaked) == 0 {
			t.Fatalf("the killed process's view %s is not mounted; the test proves nothing", dir)
		}
		if err := c.Remove(ctx, m.Revision); err != nil {
			t.Fatalf("Remove after the view's owner was killed: %v", err)
		}
		if leaked, _ := ctrdtest.MountsUnder(dir); len(leaked) > 0 {
			t.Fatalf("the killed process's view is still mounted at %v", leaked)
		}
	})
}

// runAndKill runs TestHelperProcess in mode with arg, waits until it says
// "ready", kills it with SIGKILL and returns the rest of its ready line.
func runAndKill(t *testing.T, e env, mode, arg string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), envHelper+"="+mode, envSocket+"="+e.socket, envMountDir+"="+e.mountDir, envArg+"="+arg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	ready := ""
	for lines.Scan() {
		if rest, ok := strings.CutPrefix(lines.Text(), "ready"); ok {
			ready = strings.TrimSpace(rest)
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, out)
	werr := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper %s did not die of SIGKILL (%v); it never said ready? stderr:\n%s", mode, werr, stderr.String())
	}
	return ready
}

// TestHelperProcess is the process runAndKill kills; it does nothing in a
// normal test run.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envHelper)
	if mode == "" {
		t.Skip("helper process for TestKilled")
	}
	ctx := context.Background()
	c, err := New(ctx, Options{Socket: os.Getenv(envSocket), Namespace: ctrdtest.Namespace, MountDir: os.Getenv(envMountDir)})
	if err != nil {
		t.Fatal(err)
	}
	arg := os.Getenv(envArg)
	switch mode {
	case "half-writer":
		var seed uint64
		fmt.Sscan(arg, &seed)
		data := randomBytes(seed, 3*writeChunk)
		w, err := c.Create(ctx, fileOf("killed.bin", data))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data[:len(data)/2]); err != nil {
			t.Fatal(err)
		}
		fmt.Println("ready")
	case "view":
		r, err := c.OpenRevision(ctx, arg)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("ready", r.Dir())
	default:
		t.Fatalf("unknown helper mode %q", mode)
	}
	// Wait to be killed.
	time.Sleep(time.Hour)
}

// TestSnapshotters runs a revision through each snapshotter New can pick.
func TestSnapshotters(t *testing.T) {
	e := newEnv(t)
	for i, name := range []string{Overlayfs, Native} {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			c, err := New(ctx, Options{Socket: e.socket, Namespace: "snap-" + name, Snapshotter: name, MountDir: e.mountDir})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Snapshotter() != name {
				t.Fatalf("Snapshotter() = %s, want %s", c.Snapshotter(), name)
			}
			data := randomBytes(uint64(3000+i), writeChunk+1)
			f := fileOf("s.bin", data)
			ingest(t, c, f, data)
			m := manifestOf("snap", f)
			if err := c.CommitRevision(ctx, m); err != nil {
				t.Fatal(err)
			}
			r, err := c.OpenRevision(ctx, m.Revision)
			if err != nil {
				t.Fatal(err)
			}
			checkRevisionDir(t, r, m, map[string][]byte{f.Name: data})
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if err := c.Remove(ctx, m.Revision); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"no daemon", Options{Socket: filepath.Join(t.TempDir(), "none.sock"), DialTimeout: time.Second}},
		{"unknown snapshotter", Options{Socket: e.socket, Snapshotter: "zfs"}},
		{"bad namespace", Options{Socket: e.socket, Namespace: "a/b"}},
		{"negative TTL", Options{Socket: e.socket, BlobTTL: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.MountDir = e.mountDir
			c, err := New(ctxT(t), tc.opts)
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
		})
	}
}

// TestGarbageCollection checks what keeps blobs alive when containerd's
// garbage collector runs: their ingest lease, then the gc references of the
// revisions that hold them; and that an abandoned ingest is collected.
func TestGarbageCollection(t *testing.T) {
	e := newEnv(t)
	c := e.open(t)
	ctx := ctxT(t)
	a, b := randomBytes(4000, 1000), randomBytes(4001, 1000)
	fa, fb := fileOf("a.bin", a), fileOf("b.bin", b)
	ingest(t, c, fa, a)
	ingest(t, c, fb, b)
	m := manifestOf("gc", fa)
	if err := c.CommitRevision(ctx, m); err != nil {
		t.Fatal(err)
	}
	exists := func(f manifest.File) bool {
		t.Helper()
		blob, err := c.Open(ctx, f)
		if errors.Is(err, nodecache.ErrNotExist) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		blob.Close()
		return true
	}
	steps := []struct {
		name  string
		do    func() error
		wantA bool
		wantB bool
	}{
		{"leased", func() error { return nil }, true, true},
		{"leases expired", func() error {
			return c.releaseBlobs(c.ctx(ctx), map[string]bool{"sha256:" + fa.SHA256: true, "sha256:" + fb.SHA256: true})
		}, true, false},
		{"revision removed", func() error { return c.Remove(ctx, m.Revision) }, false, false},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if err := c.collectGarbage(c.ctx(ctx)); err != nil {
			t.Fatal(err)
		}
		if got := exists(fa); got != s.wantA {
			t.Errorf("%s: blob a exists %v, want %v", s.name, got, s.wantA)
		}
		if got := exists(fb); got != s.wantB {
			t.Errorf("%s: blob b exists %v, want %v", s.name, got, s.wantB)
		}
	}

	data := randomBytes(4002, 2*writeChunk)
	f := fileOf("abandoned.bin", data)
	w, err := c.Create(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data[:writeChunk]); err != nil {
		t.Fatal(err)
	}
	ref := blobRef(digest.Digest("sha256:" + f.SHA256))
	if _, err := c.content.Status(c.ctx(ctx), ref); err != nil {
		t.Fatalf("status of the ingest being written: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.collectGarbage(c.ctx(ctx)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.content.Status(c.ctx(ctx), ref); !errdefs.IsNotFound(err) {
		t.Errorf("status of the abandoned ingest after gc: %v, want not found", err)
	}
}

// TestBudgetOnCommit checks MaxBytes: each commit removes the least
// recently used revisions until the rest fit, never the one it commits.
func TestBudgetOnCommit(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c, err := New(ctx, Options{Socket: e.socket, Namespace: "budget", MountDir: e.mountDir, MaxBytes: 2500})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seed := uint64(3000)
	commit := func(name string, size int) string {
		t.Helper()
		seed++
		data := randomBytes(seed, size)
		f := fileOf("w.bin", data)
		ingest(t, c, f, data)
		m := manifestOf(name, f)
		if err := c.CommitRevision(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m.Revision
	}
	cached := func() []string {
		t.Helper()
		revs, err := c.Revisions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range revs {
			out = append(out, r.Revision)
		}
		return out
	}
	r0 := commit("b0", 1000)
	r1 := commit("b1", 1000)
	if got := cached(); !slices.Equal(got, []string{r0, r1}) {
		t.Fatalf("two revisions within the budget: cached %v", got)
	}
	r2 := commit("b2", 1000) // 3000 > 2500: the least recently used goes
	if got := cached(); !slices.Equal(got, []string{r1, r2}) {
		t.Fatalf("after the third commit: cached %v, want %v", got, []string{r1, r2})
	}
	big := commit("big", 4000) // over the budget alone: kept, the rest go
	if got := cached(); !slices.Equal(got, []string{big}) {
		t.Fatalf("after a commit larger than the budget: cached %v, want only it", got)
	}
}
