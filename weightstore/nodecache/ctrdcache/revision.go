//go:build linux

package ctrdcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/nodecache"
)

// buildTTL bounds how long what a killed builder leaves survives when no
// later build of the same revision removes it.
const buildTTL = 24 * time.Hour

// Blobs are copied into a revision in reads of copyBuffer bytes,
// copyWorkers at a time.
const (
	copyBuffer  = 4 << 20
	copyWorkers = 2
)

// Prefixes of the directories the cache mounts snapshots on.
const (
	viewDirPrefix  = "stoke-view-"
	buildDirPrefix = "stoke-build-"
)

// checkRevision reports whether revision is "sha256:" and 64 hex digits.
func checkRevision(revision string) error {
	hexPart, ok := strings.CutPrefix(revision, manifest.RevisionPrefix)
	if !ok {
		return fmt.Errorf("revision %q does not start with %q", revision, manifest.RevisionPrefix)
	}
	if err := checkHex(hexPart); err != nil {
		return fmt.Errorf("revision %q: %w", revision, err)
	}
	return nil
}

// Snapshot keys and ingest refs of a revision.
func revisionName(revision string) string { return "stoke/rev/" + revision }
func buildKey(revision string) string     { return "stoke/prep/" + revision }
func buildLockRef(revision string) string { return "stoke-lock-" + revision }

// committed reports whether the revision's snapshot is committed.
func (c *Cache) committed(ctx context.Context, revision string) (snapshots.Info, bool, error) {
	info, err := c.snapshots.Stat(ctx, revisionName(revision))
	if errdefs.IsNotFound(err) {
		return snapshots.Info{}, false, nil
	}
	if err != nil {
		return snapshots.Info{}, false, fmt.Errorf("stat snapshot of revision %s: %w", revision, err)
	}
	return info, info.Kind == snapshots.KindCommitted, nil
}

// CommitRevision builds the revision's snapshot: every file of m, copied
// from its blob, and manifest.json. Builders of one revision are
// single-flight across processes; what a killed builder left is removed
// first. Until the snapshot is committed, OpenRevision does not see it.
func (c *Cache) CommitRevision(ctx context.Context, m *manifest.Manifest) (err error) {
	if m == nil {
		return errors.New("commit revision: nil manifest")
	}
	data, err := m.Marshal()
	if err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	ctx = c.ctx(ctx)
	if _, ok, err := c.committed(ctx, m.Revision); err != nil || ok {
		return err
	}

	// The build's lease holds the blobs being copied, the lock's ingest and
	// the active snapshot.
	lease, err := c.leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(buildTTL),
		leases.WithLabels(map[string]string{labelBuild: m.Revision}))
	if err != nil {
		return fmt.Errorf("commit revision %s of %s: create lease: %w", m.Revision, m.Model, err)
	}
	defer func() {
		cctx, cancel := c.cleanupCtx(ctx)
		defer cancel()
		if lerr := c.deleteLease(cctx, lease.ID); lerr != nil {
			err = errors.Join(err, fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, lerr))
		}
	}()
	if err := c.holdBlobs(ctx, lease, m); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	lctx := leases.WithLease(ctx, lease.ID)

	unlock, done, err := c.lock(ctx, lctx, buildLockRef(m.Revision), func(ctx context.Context) (bool, error) {
		_, ok, err := c.committed(ctx, m.Revision)
		return ok, err
	})
	if err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	if done {
		return nil
	}
	defer unlock()
	if err := c.removeStaleBuild(ctx, m.Revision); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	if err := c.build(ctx, lctx, m, data); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	if c.maxBytes > 0 {
		if _, err := c.trim(ctx, c.maxBytes, m.Revision); err != nil {
			return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
		}
	}
	return nil
}

// holdBlobs adds every blob of m to lease, so that the garbage collector
// keeps them while they are copied, and reports the first one missing.
func (c *Cache) holdBlobs(ctx context.Context, lease leases.Lease, m *manifest.Manifest) error {
	for _, f := range m.Files {
		dgst, err := blobDigest(f)
		if err != nil {
			return err
		}
		if err := c.leases.AddResource(ctx, lease, leases.Resource{ID: dgst.String(), Type: "content"}); err != nil {
			return fmt.Errorf("lease blob %s of %s: %w", dgst, f.Name, err)
		}
		info, err := c.content.Info(ctx, dgst)
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("blob %s of %s: %w", dgst, f.Name, nodecache.ErrNotExist)
		}
		if err != nil {
			return fmt.Errorf("blob %s of %s: %w", dgst, f.Name, err)
		}
		if info.Size != f.Size {
			return fmt.Errorf("blob %s of %s holds %d bytes, not %d: %w", dgst, f.Name, info.Size, f.Size, nodecache.ErrNotExist)
		}
	}
	return nil
}

// lock takes containerd's lock on ref, an ingest that holds nothing but a
// heartbeat, by holding a write stream open on it; lctx carries the lease
// that keeps the ingest. It waits while another process holds the lock,
// until ctx ends or done reports true (then it returns done true and no
// unlock). The lock is released by unlock or when this process dies.
func (c *Cache) lock(ctx, lctx context.Context, ref string, done func(context.Context) (bool, error)) (unlock func(), finished bool, err error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(lctx))
	cw, finished, err := c.acquire(ctx, sctx, cancel, ref, ocispec.Descriptor{}, done)
	if err != nil || finished {
		cancel()
		if err != nil {
			err = fmt.Errorf("lock %s: %w", ref, err)
		}
		return nil, finished, err
	}
	stopBeat := heartbeat(cw)
	return func() {
		stopBeat()
		// Abort before closing, as a blob writer does: the waiters then
		// see no ingest and ask at once.
		actx, acancel := c.cleanupCtx(ctx)
		c.content.Abort(actx, ref)
		acancel()
		cw.Close()
		cancel()
	}, false, nil
}

// removeStaleBuild removes what an earlier builder of revision left: its
// active snapshot and its mount. The caller holds the build lock, so no
// live builder owns them. The stale builder's lease holds nothing else
// that matters (the lock's empty ingest) and expires by itself.
func (c *Cache) removeStaleBuild(ctx context.Context, revision string) error {
	key := buildKey(revision)
	info, err := c.snapshots.Stat(ctx, key)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat stale build %s: %w", key, err)
	}
	if err := c.unmountStale(info.Labels[labelMount]); err != nil {
		return fmt.Errorf("stale build %s: %w", key, err)
	}
	if err := c.snapshots.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove stale build %s: %w", key, err)
	}
	return nil
}

// labelFilter is a containerd filter matching objects whose label key has
// value, or that have the label at all when value is "".
func labelFilter(key, value string) string {
	if value == "" {
		return "labels." + strconv.Quote(key)
	}
	return "labels." + strconv.Quote(key) + "==" + strconv.Quote(value)
}

// build prepares the revision's active snapshot under lctx's lease, fills
// it and commits it as the revision.
func (c *Cache) build(ctx, lctx context.Context, m *manifest.Manifest, data []byte) (err error) {
	dir, err := os.MkdirTemp(c.mountDir, buildDirPrefix)
	if err != nil {
		return fmt.Errorf("mount point: %w", err)
	}
	defer func() {
		if rerr := os.Remove(dir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}()
	key := buildKey(m.Revision)
	mounts, err := c.snapshots.Prepare(lctx, key, "", snapshots.WithLabels(map[string]string{
		labelBuild: m.Revision,
		labelMount: dir,
		labelOwner: c.owner,
	}))
	if err != nil {
		return fmt.Errorf("prepare snapshot %s: %w", key, err)
	}
	removeBuild := func(err error) error {
		cctx, cancel := c.cleanupCtx(ctx)
		defer cancel()
		if rerr := c.snapshots.Remove(cctx, key); rerr != nil && !errdefs.IsNotFound(rerr) {
			err = errors.Join(err, fmt.Errorf("remove snapshot %s: %w", key, rerr))
		}
		return err
	}
	if err := mount.All(mounts, dir); err != nil {
		return removeBuild(fmt.Errorf("mount snapshot %s on %s: %w", key, dir, err))
	}
	ferr := c.fill(ctx, dir, m, data)
	if uerr := mount.UnmountAll(dir, 0); uerr != nil {
		// Detach it so that the directory can go; the snapshot must not
		// be committed while something may still write into it.
		mount.UnmountAll(dir, syscall.MNT_DETACH)
		ferr = errors.Join(ferr, fmt.Errorf("unmount %s: %w", dir, uerr))
	}
	if ferr != nil {
		return removeBuild(ferr)
	}

	sum := sha256.Sum256(data)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	labels := map[string]string{
		labelRevision: m.Revision,
		labelModel:    m.Model,
		labelBytes:    strconv.FormatInt(m.TotalBytes, 10),
		labelManifest: manifest.RevisionPrefix + hex.EncodeToString(sum[:]),
		labelUsed:     now,
		labelGCRoot:   now,
	}
	seen := map[string]bool{}
	for _, f := range m.Files {
		if !seen[f.SHA256] {
			labels[labelGCRefPfx+strconv.Itoa(len(seen))] = manifest.RevisionPrefix + f.SHA256
			seen[f.SHA256] = true
		}
	}
	name := revisionName(m.Revision)
	if err := c.snapshots.Commit(lctx, name, key, snapshots.WithLabels(labels)); err != nil {
		if errdefs.IsAlreadyExists(err) {
			return removeBuild(nil)
		}
		return removeBuild(fmt.Errorf("commit snapshot %s as %s: %w", key, name, err))
	}
	return nil
}

// fill copies every file of m from its blob into dir, and data as
// manifest.json, all read-only and synced.
func (c *Cache) fill(ctx context.Context, dir string, m *manifest.Manifest, data []byte) error {
	for _, f := range m.Files {
		if err := c.copyBlob(ctx, filepath.Join(dir, f.Name), f); err != nil {
			return err
		}
	}
	if err := writeSynced(filepath.Join(dir, manifest.FileName), func(file *os.File) error {
		_, err := file.Write(data)
		return err
	}); err != nil {
		return err
	}
	return syncDir(dir)
}

// copyBlob writes f's blob to path. Each read is a round trip to
// containerd, so copyWorkers of them are in flight at once, each of
// copyBuffer bytes.
func (c *Cache) copyBlob(ctx context.Context, path string, f manifest.File) error {
	dgst, err := blobDigest(f)
	if err != nil {
		return err
	}
	err = writeSynced(path, func(file *os.File) error {
		g, gctx := errgroup.WithContext(ctx)
		ra, err := c.content.ReaderAt(gctx, ocispec.Descriptor{Digest: dgst, Size: f.Size})
		if err != nil {
			return err
		}
		defer ra.Close()
		var next atomic.Int64
		for range copyWorkers {
			g.Go(func() error {
				buf := make([]byte, copyBuffer)
				for {
					off := next.Add(copyBuffer) - copyBuffer
					if off >= f.Size {
						return nil
					}
					p := buf[:min(copyBuffer, f.Size-off)]
					n, err := ra.ReadAt(p, off)
					if n < len(p) {
						if err == nil || err == io.EOF {
							err = io.ErrUnexpectedEOF
						}
						return fmt.Errorf("read at %d: %w", off, errdefs.FromGRPC(err))
					}
					if _, err := file.WriteAt(p, off); err != nil {
						return err
					}
				}
			})
		}
		return g.Wait()
	})
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("blob %s of %s: %w", dgst, f.Name, nodecache.ErrNotExist)
	}
	if err != nil {
		return fmt.Errorf("copy blob %s of %s: %w", dgst, f.Name, err)
	}
	return nil
}

// writeSynced creates path read-only, fills it with write and syncs it.
func writeSynced(path string, write func(*os.File) error) error {
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	err = write(file)
	if err == nil {
		err = file.Sync()
	}
	if cerr := file.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// OpenRevision mounts a read-only view of a committed revision on a fresh
// directory under Options.MountDir. The view is a child of the revision's
// snapshot, which keeps Remove from removing the revision while it is open.
func (c *Cache) OpenRevision(ctx context.Context, revision string) (nodecache.Revision, error) {
	if err := checkRevision(revision); err != nil {
		return nil, fmt.Errorf("open revision: %w", err)
	}
	ctx = c.ctx(ctx)
	info, ok, err := c.committed(ctx, revision)
	if err != nil {
		return nil, fmt.Errorf("open revision: %w", err)
	}
	if !ok {
		return nil, fmt.Errorf("open revision %s: %w", revision, nodecache.ErrNotExist)
	}
	dir, err := os.MkdirTemp(c.mountDir, viewDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("open revision %s: mount point: %w", revision, err)
	}
	id := randomID()
	v := &view{c: c, ctx: ctx, revision: revision, dir: dir, key: "stoke/view/" + revision + "/" + id}
	lease, err := c.leases.Create(ctx, leases.WithID("stoke-view-"+id), leases.WithLabels(map[string]string{
		labelView:    revision,
		labelViewKey: v.key,
		labelMount:   dir,
		labelOwner:   c.owner,
	}))
	if err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("open revision %s: create lease: %w", revision, err)
	}
	v.lease = lease.ID
	mounts, err := c.snapshots.View(leases.WithLease(ctx, lease.ID), v.key, revisionName(revision))
	if err != nil {
		if errdefs.IsNotFound(err) {
			err = nodecache.ErrNotExist
		}
		return nil, errors.Join(fmt.Errorf("open revision %s: view: %w", revision, err), v.release())
	}
	if err := mount.All(mounts, dir); err != nil {
		return nil, errors.Join(fmt.Errorf("open revision %s: mount on %s: %w", revision, dir, err), v.release())
	}
	v.mounted = true
	if v.m, err = readManifest(dir, revision, info.Labels[labelManifest]); err != nil {
		return nil, errors.Join(fmt.Errorf("open revision %s: %w", revision, err), v.release())
	}
	// Last use is advisory (for Trim): a failure to record it is no reason
	// to refuse the view.
	c.snapshots.Update(ctx, snapshots.Info{
		Name:   revisionName(revision),
		Labels: map[string]string{labelUsed: time.Now().UTC().Format(time.RFC3339Nano)},
	}, "labels."+labelUsed)
	return v, nil
}

// readManifest reads and checks the manifest.json of a mounted revision.
func readManifest(dir, revision, wantDigest string) (*manifest.Manifest, error) {
	path := filepath.Join(dir, manifest.FileName)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	if got := manifest.RevisionPrefix + hex.EncodeToString(sum[:]); wantDigest != "" && got != wantDigest {
		return nil, fmt.Errorf("%s: digest %s, the revision's label says %s", path, got, wantDigest)
	}
	m, err := manifest.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if m.Revision != revision {
		return nil, fmt.Errorf("%s: revision %s, want %s", path, m.Revision, revision)
	}
	return m, nil
}

// view is an open, mounted view of a revision.
type view struct {
	c        *Cache
	ctx      context.Context // OpenRevision's, for releasing
	revision string
	dir      string
	key      string // the view snapshot
	lease    string
	mounted  bool
	m        *manifest.Manifest
	once     sync.Once
	err      error
}

// Manifest is the revision's manifest.
func (v *view) Manifest() *manifest.Manifest { return v.m }

// Dir is the read-only directory holding the revision's files.
func (v *view) Dir() string { return v.dir }

// Close unmounts the view and removes its snapshot and lease.
func (v *view) Close() error {
	v.once.Do(func() {
		if err := v.release(); err != nil {
			v.err = fmt.Errorf("close revision %s: %w", v.revision, err)
		}
	})
	return v.err
}

// release undoes what OpenRevision did. Files still open under the
// directory keep working: the mount is detached, not forced.
func (v *view) release() error {
	ctx, cancel := v.c.cleanupCtx(v.ctx)
	defer cancel()
	var errs []error
	if v.mounted {
		if err := mount.UnmountAll(v.dir, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", v.dir, err))
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(v.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if v.lease != "" {
		if err := v.c.snapshots.Remove(ctx, v.key); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove view %s: %w", v.key, err))
		}
		if err := v.c.deleteLease(ctx, v.lease); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
