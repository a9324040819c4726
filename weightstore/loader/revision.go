package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/stokehq/stoke/engine/device"
	"github.com/stokehq/stoke/internal/ctxio"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/nodecache"
)

// Request names the revision to load.
type Request struct {
	// Bucket is opened at the root holding the model's prefix.
	Bucket bucket.Bucket
	// Model is the model's name, its prefix in the bucket.
	Model string
	// Revision pins a digest; "" loads the bucket's current manifest. A
	// pinned revision that the bucket no longer holds loads from the node
	// cache when it is there.
	Revision string
}

// Result is a loaded revision. Weights (.safetensors files) sit in device
// buffers; the small files beside them in host memory.
type Result struct {
	Manifest *manifest.Manifest
	Tier     tier.Tier
	// Device holds each weight file's buffer by file name.
	Device map[string]device.Buffer
	// Host holds every other file's content by file name.
	Host map[string][]byte
	// FromCache and FromBucket count the bytes read from each.
	FromCache, FromBucket int64
	// Elapsed is the whole load; Alloc the part spent allocating device
	// memory (which a warm runtime has done beforehand).
	Elapsed, Alloc time.Duration

	// cached is closed once what this load puts into the node cache is
	// written and committed, which runs after the load returns; cacheErr
	// is then the outcome.
	cached   chan struct{}
	cacheErr error
}

// WaitCache waits until what this load puts into the node cache is
// committed, and returns the first error. The load itself does not wait:
// the cache is written from the loaded memory and made durable (fsync) at
// the speed of the disk (or of containerd's ingest) while the engine
// already serves.
func (r *Result) WaitCache(ctx context.Context) error {
	if r.cached == nil {
		return nil
	}
	select {
	case <-r.cached:
		return r.cacheErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Free releases the device buffers, after the cache write that reads them
// (see WaitCache) is done.
func (r *Result) Free() error {
	if r.cached != nil {
		<-r.cached
	}
	var errs []error
	for _, b := range r.Device {
		errs = append(errs, b.Free())
	}
	r.Device = nil
	return errors.Join(errs...)
}

// Files returns every file's loaded bytes by name; ok is false when some
// device memory is not host-addressable (only the CPU device's is).
func (r *Result) Files() (files map[string][]byte, ok bool) {
	files = make(map[string][]byte, len(r.Device)+len(r.Host))
	for name, data := range r.Host {
		files[name] = data
	}
	for name, buf := range r.Device {
		hm, ok := buf.(device.HostMemory)
		if !ok {
			return nil, false
		}
		files[name] = hm.Bytes()[:buf.Size()]
	}
	return files, true
}

// OnDevice reports whether a revision file belongs in device memory.
func OnDevice(name string) bool { return strings.HasSuffix(name, ".safetensors") }

// LoadRevision streams a revision into dev: from cache when it holds the
// revision (T2), else from the bucket (T3), verifying every byte read from
// the bucket against the manifest and teeing it into the cache. A nil
// cache always reads the bucket. Nothing partial is returned: on error
// every buffer is freed and no cache entry is committed.
func LoadRevision(ctx context.Context, dev device.Device, cache nodecache.Cache, req Request, opts Options) (res *Result, err error) {
	start := time.Now()
	if err := manifest.CheckName(req.Model); err != nil {
		return nil, fmt.Errorf("load model %q: %w", req.Model, err)
	}
	what := req.Model
	if req.Revision != "" {
		what += "@" + req.Revision
	}
	if cache != nil && req.Revision != "" {
		res, err := loadCached(ctx, dev, cache, req.Revision, opts)
		if err == nil || !errors.Is(err, nodecache.ErrNotExist) {
			return finishResult(res, err, what, start)
		}
	}
	m, err := readManifest(ctx, req.Bucket, req.Model)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", what, err)
	}
	if req.Revision != "" && m.Revision != req.Revision {
		return nil, fmt.Errorf("load %s: the bucket now holds revision %s and the node cache does not hold the one asked for", what, m.Revision)
	}
	if cache != nil && req.Revision == "" {
		res, err := loadCached(ctx, dev, cache, m.Revision, opts)
		if err == nil || !errors.Is(err, nodecache.ErrNotExist) {
			return finishResult(res, err, what, start)
		}
	}
	res, err = loadRemote(ctx, dev, cache, req, m, opts)
	return finishResult(res, err, what, start)
}

func finishResult(res *Result, err error, what string, start time.Time) (*Result, error) {
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", what, err)
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

func readManifest(ctx context.Context, b bucket.Bucket, model string) (*manifest.Manifest, error) {
	rc, err := b.ReadRange(ctx, model+"/"+manifest.FileName, 0, -1)
	if err != nil {
		if errors.Is(err, bucket.ErrNotExist) {
			return nil, fmt.Errorf("no %s under %s/%s: not a pushed revision: %w", manifest.FileName, b.URL(), model, err)
		}
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", model, manifest.FileName, err)
	}
	m, err := manifest.Parse(data)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// loadCached is T2: every file from the cached revision's directory, with
// no hashing (the cache verified the content when it was committed).
func loadCached(ctx context.Context, dev device.Device, cache nodecache.Cache, revision string, opts Options) (*Result, error) {
	rv, err := cache.OpenRevision(ctx, revision)
	if err != nil {
		return nil, err
	}
	defer rv.Close()
	m := rv.Manifest()
	res, files, err := allocate(ctx, dev, m)
	if err != nil {
		return nil, err
	}
	res.Tier = tier.Cache
	var opened []*os.File
	defer func() {
		for _, f := range opened {
			f.Close()
		}
	}()
	for i, mf := range m.Files {
		fd, err := os.Open(filepath.Join(rv.Dir(), mf.Name))
		if err != nil {
			res.Free()
			return nil, fmt.Errorf("open cached %s: %w", mf.Name, err)
		}
		opened = append(opened, fd)
		files[i].Src = LocalFile(fd)
		res.FromCache += mf.Size
	}
	if err := streamHostFirst(ctx, dev, files, res.Host, opts); err != nil {
		res.Free()
		return nil, err
	}
	return res, nil
}

// loadRemote is T3: files the cache already holds come from it, the rest
// from the bucket, verified and teed into the cache; the revision is
// committed to the cache only once everything verified.
func loadRemote(ctx context.Context, dev device.Device, cache nodecache.Cache, req Request, m *manifest.Manifest, opts Options) (_ *Result, err error) {
	if err := checkObjects(ctx, req.Bucket, req.Model, m); err != nil {
		return nil, err
	}
	res, files, err := allocate(ctx, dev, m)
	if err != nil {
		return nil, err
	}
	res.Tier = tier.Bucket
	var closers []io.Closer
	var writes []cacheWrite
	defer func() {
		for _, c := range closers {
			c.Close()
		}
		if err != nil {
			for _, cw := range writes {
				cw.w.Close()
			}
			res.Free()
		}
	}()
	for i, mf := range m.Files {
		remote := BucketObject(req.Bucket, req.Model+"/"+mf.Name)
		if cache == nil {
			files[i].Src, files[i].Verify = remote, true
			res.FromBucket += mf.Size
			continue
		}
		blob, w, err := cacheEntry(ctx, cache, mf)
		if err != nil {
			return nil, err
		}
		switch {
		case blob != nil:
			closers = append(closers, blob)
			files[i].Src = LocalFile(blob)
			res.FromCache += mf.Size
		default:
			files[i].Src, files[i].Verify = remote, true
			cw := cacheWrite{w: w, file: &files[i]}
			if _, ok := files[i].Dst.(device.HostMemory); !ok && files[i].Dst != nil {
				// Memory the host cannot read back is cached as it streams.
				files[i].Tee, cw.teed = w, true
			}
			writes = append(writes, cw)
			res.FromBucket += mf.Size
		}
	}
	if err := streamHostFirst(ctx, dev, files, res.Host, opts); err != nil {
		return nil, err
	}
	if res.FromBucket == 0 {
		res.Tier = tier.Cache
	}
	if cache != nil {
		res.cached = make(chan struct{})
		go res.commitCache(context.WithoutCancel(ctx), cache, m, writes, opts.withDefaults().Logger)
	}
	return res, nil
}

// streamHostFirst streams files; with opts.HostFiles set, the host files
// go first and are handed over (as host) before the weights stream.
func streamHostFirst(ctx context.Context, dev device.Device, files []File, host map[string][]byte, opts Options) error {
	if opts.HostFiles == nil {
		return Stream(ctx, dev, files, opts)
	}
	var small, weights []File
	for _, f := range files {
		if f.Dst == nil {
			small = append(small, f)
		} else {
			weights = append(weights, f)
		}
	}
	quiet := opts
	quiet.Progress = nil
	if err := Stream(ctx, dev, small, quiet); err != nil {
		return err
	}
	opts.HostFiles(host)
	return Stream(ctx, dev, weights, opts)
}

// cacheWrite is a file a load puts into the node cache: teed while it
// streamed, or written from the loaded memory afterwards.
type cacheWrite struct {
	w    nodecache.Writer
	file *File
	teed bool
}

// commitCache writes the verified files the load did not tee into the
// cache from the loaded memory, commits every blob, then the revision.
// Until a blob is committed its ingest stays locked, so a concurrent load of
// the same blob waits for it and then reads it from the cache.
func (r *Result) commitCache(ctx context.Context, cache nodecache.Cache, m *manifest.Manifest, writes []cacheWrite, log *slog.Logger) {
	defer close(r.cached)
	var errs []error
	for _, cw := range writes {
		if len(errs) == 0 {
			if !cw.teed {
				f := cw.file
				data := f.Host
				if f.Dst != nil {
					data = f.Dst.(device.HostMemory).Bytes()
				}
				if err := writeAll(ctx, cw.w, data[:f.Size]); err != nil {
					errs = append(errs, fmt.Errorf("write %s: %w", f.Name, err))
				}
			}
			if len(errs) == 0 {
				if err := cw.w.Commit(ctx); err != nil {
					errs = append(errs, err)
				}
			}
		}
		cw.w.Close()
	}
	if err := errors.Join(errs...); err != nil {
		r.cacheErr = fmt.Errorf("commit %s to the node cache: %w", m.Model, err)
	} else if err := cache.CommitRevision(ctx, m); err != nil {
		r.cacheErr = fmt.Errorf("commit revision %s of %s to the node cache: %w", m.Revision, m.Model, err)
	}
	if r.cacheErr != nil {
		log.Warn("node cache commit failed; the next load reads the bucket again", "err", r.cacheErr)
	}
}

// cacheEntry returns the cached blob for f, or a writer to ingest it. It
// waits while another loader ingests the same blob (single flight) and
// then reads what that loader committed.
func cacheEntry(ctx context.Context, cache nodecache.Cache, f manifest.File) (nodecache.Blob, nodecache.Writer, error) {
	for {
		blob, err := cache.Open(ctx, f)
		if err == nil {
			return blob, nil, nil
		}
		if !errors.Is(err, nodecache.ErrNotExist) {
			return nil, nil, fmt.Errorf("open cached %s: %w", f.Name, err)
		}
		w, err := cache.Create(ctx, f)
		if err == nil {
			return nil, w, nil
		}
		if !errors.Is(err, nodecache.ErrExists) {
			return nil, nil, fmt.Errorf("cache %s: %w", f.Name, err)
		}
	}
}

// checkObjects lists the model's prefix once and checks that every file
// of m is there with its size, so a missing or truncated object is one
// clear error before any byte moves.
// writeAll writes data to w in pieces, stopping when ctx ends.
func writeAll(ctx context.Context, w io.Writer, data []byte) error {
	const piece = 4 << 20
	for len(data) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := w.Write(data[:min(piece, len(data))])
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func checkObjects(ctx context.Context, b bucket.Bucket, model string, m *manifest.Manifest) error {
	objs, err := b.List(ctx, model+"/")
	if err != nil {
		return err
	}
	sizes := make(map[string]int64, len(objs))
	for _, o := range objs {
		sizes[strings.TrimPrefix(o.Key, model+"/")] = o.Size
	}
	for _, f := range m.Files {
		size, ok := sizes[f.Name]
		switch {
		case !ok:
			return fmt.Errorf("%s of revision %s is missing from %s", f.Name, m.Revision, b.URL())
		case size < f.Size:
			return fmt.Errorf("%s of revision %s is truncated: %d of %d bytes in %s", f.Name, m.Revision, size, f.Size, b.URL())
		case size != f.Size:
			return fmt.Errorf("%s of revision %s has %d bytes in %s, the manifest says %d", f.Name, m.Revision, size, b.URL(), f.Size)
		}
	}
	return nil
}

// allocate makes a Result with a destination for every file of m.
func allocate(ctx context.Context, dev device.Device, m *manifest.Manifest) (*Result, []File, error) {
	start := time.Now()
	res := &Result{Manifest: m, Device: map[string]device.Buffer{}, Host: map[string][]byte{}}
	defer func() { res.Alloc = time.Since(start) }()
	files := make([]File, len(m.Files))
	for i, mf := range m.Files {
		files[i] = File{Name: mf.Name, Size: mf.Size, SHA256: mf.SHA256}
		if OnDevice(mf.Name) {
			buf, err := dev.Alloc(ctx, mf.Size)
			if err != nil {
				res.Free()
				return nil, nil, fmt.Errorf("allocate %s: %w", mf.Name, err)
			}
			res.Device[mf.Name] = buf
			files[i].Dst = buf
			continue
		}
		host := make([]byte, mf.Size)
		res.Host[mf.Name] = host
		files[i].Host = host
	}
	return res, files, nil
}

// Prefetch puts a revision into the node cache without loading it
// anywhere: each file the cache lacks is read from the bucket once and
// committed (the cache verifies it), then the revision. It is how a node
// warms its cache for runtimes that cannot write it themselves.
func Prefetch(ctx context.Context, cache nodecache.Cache, req Request, opts Options) (*manifest.Manifest, error) {
	opts = opts.withDefaults()
	m, err := readManifest(ctx, req.Bucket, req.Model)
	if err != nil {
		return nil, fmt.Errorf("prefetch %s: %w", req.Model, err)
	}
	if req.Revision != "" && m.Revision != req.Revision {
		return nil, fmt.Errorf("prefetch %s@%s: the bucket now holds revision %s", req.Model, req.Revision, m.Revision)
	}
	if err := checkObjects(ctx, req.Bucket, req.Model, m); err != nil {
		return nil, fmt.Errorf("prefetch %s: %w", req.Model, err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Parallel)
	for _, f := range m.Files {
		blob, w, err := cacheEntry(ctx, cache, f)
		if err != nil {
			g.Wait()
			return nil, fmt.Errorf("prefetch %s: %w", req.Model, err)
		}
		if blob != nil {
			blob.Close()
			continue
		}
		g.Go(func() error {
			defer w.Close()
			rc, err := req.Bucket.ReadRange(gctx, req.Model+"/"+f.Name, 0, -1)
			if err != nil {
				return err
			}
			defer rc.Close()
			if _, err := io.Copy(w, ctxio.Reader(gctx, rc)); err != nil {
				return fmt.Errorf("fetch %s: %w", f.Name, err)
			}
			return w.Commit(gctx)
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("prefetch %s: %w", req.Model, err)
	}
	if err := cache.CommitRevision(ctx, m); err != nil {
		return nil, fmt.Errorf("prefetch %s: %w", req.Model, err)
	}
	return m, nil
}
