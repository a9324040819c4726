//go:build unix

package nodecache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/stokehq/stoke/weightstore/manifest"
)

// errCorruptRevision marks a revision directory that does not match its
// manifest. Read-only.
var errCorruptRevision = errors.New("corrupt revision")

// CommitRevision builds revisions/<hex>/ from hard links to m's blobs and
// m's manifest.json, renames it into place, and then evicts down to the
// budget (never the revision just committed). A revision already present
// is only marked used.
func (d *Dir) CommitRevision(ctx context.Context, m *manifest.Manifest) error {
	if m == nil {
		return errors.New("commit revision: nil manifest")
	}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	digest, err := revisionHex(m.Revision)
	if err != nil {
		return fmt.Errorf("commit revision of %s: %w", m.Model, err)
	}
	if err := d.commitRevision(ctx, m, digest); err != nil {
		return err
	}
	if err := d.evict(ctx, digest); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	return nil
}

func (d *Dir) commitRevision(ctx context.Context, m *manifest.Manifest, digest string) error {
	final := d.revisionPath(digest)
	if present, err := d.touchIfPresent(final); err != nil || present {
		return err
	}
	l, err := lockFile(ctx, d.revisionLock(digest), lockEX)
	if err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	err = d.buildRevision(ctx, m, digest)
	return errors.Join(err, l.unlock(true))
}

// touchIfPresent marks the revision directory at path used when it exists.
func (d *Dir) touchIfPresent(path string) (bool, error) {
	now := time.Now()
	err := os.Chtimes(path, now, now)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("mark revision %s used: %w", path, err)
	}
	return true, nil
}

// buildRevision is CommitRevision's work under the revision's lock.
func (d *Dir) buildRevision(ctx context.Context, m *manifest.Manifest, digest string) error {
	final := d.revisionPath(digest)
	if present, err := d.touchIfPresent(final); err != nil || present {
		return err
	}
	if err := d.removeRevisionTemps(digest); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(d.revisionsDir(), digest+".tmp-")
	if err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	if err := d.fillRevision(ctx, m, tmp); err != nil {
		return errors.Join(err, removeTree(tmp))
	}
	if err := os.Rename(tmp, final); err != nil {
		return errors.Join(fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err), removeTree(tmp))
	}
	if err := syncDir(d.revisionsDir()); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	_, err = d.touchIfPresent(final)
	return err
}

// fillRevision links every file of m into dir, writes manifest.json, and
// makes dir read-only.
func (d *Dir) fillRevision(ctx context.Context, m *manifest.Manifest, dir string) error {
	for _, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
		}
		if err := d.linkBlob(ctx, f, filepath.Join(dir, f.Name)); err != nil {
			return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
		}
	}
	data, err := m.Marshal()
	if err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	if err := writeSynced(filepath.Join(dir, manifest.FileName), data); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		return fmt.Errorf("commit revision %s of %s: %w", m.Revision, m.Model, err)
	}
	return nil
}

// linkBlob hard-links f's blob to dst, holding the blob's ingest lock so
// that eviction cannot remove the blob between the check and the link.
func (d *Dir) linkBlob(ctx context.Context, f manifest.File, dst string) error {
	l, err := lockFile(ctx, d.ingestLock(f.SHA256), lockEX)
	if err != nil {
		return fmt.Errorf("file %s (blob %s): %w", f.Name, f.SHA256, err)
	}
	err = d.linkBlobLocked(f, dst)
	return errors.Join(err, l.unlock(true))
}

func (d *Dir) linkBlobLocked(f manifest.File, dst string) error {
	absent, err := d.removeIfWrongSize(f)
	if err != nil {
		return err
	}
	if absent {
		return fmt.Errorf("file %s (blob %s): %w", f.Name, f.SHA256, ErrNotExist)
	}
	if err := os.Link(d.blobPath(f.SHA256), dst); err != nil {
		return fmt.Errorf("file %s (blob %s): %w", f.Name, f.SHA256, err)
	}
	return nil
}

// writeSynced creates path read-only with data and fsyncs it.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// removeRevisionTemps removes half-built and half-removed directories of
// revision digest left by killed committers and evictors. The caller holds
// the revision's lock exclusively.
func (d *Dir) removeRevisionTemps(digest string) error {
	var errs []error
	for _, pattern := range []string{digest + ".tmp-*", digest + ".del-*"} {
		names, err := filepath.Glob(filepath.Join(d.revisionsDir(), pattern))
		if err != nil {
			return fmt.Errorf("list leftovers of revision %s: %w", digest, err)
		}
		for _, name := range names {
			errs = append(errs, removeTree(name))
		}
	}
	return errors.Join(errs...)
}

// removeRevisionDir takes revisions/<digest>/ out of sight with a rename,
// then deletes it. The caller holds the revision's lock exclusively.
func (d *Dir) removeRevisionDir(digest string) error {
	trash := filepath.Join(d.revisionsDir(), digest+".del-"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatInt(time.Now().UnixNano(), 10))
	if err := os.Rename(d.revisionPath(digest), trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove revision %s: %w", digest, err)
	}
	if err := syncDir(d.revisionsDir()); err != nil {
		return fmt.Errorf("remove revision %s: %w", digest, err)
	}
	return removeTree(trash)
}

// removeTree deletes a revision directory, which may be read-only.
func removeTree(path string) error {
	if err := os.Chmod(path, 0o755); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// OpenRevision opens revisions/<hex>/ for reading. It holds a shared lock
// on revisions/<hex>.lock until Close, which eviction (in any process)
// respects, and marks the revision used. A directory whose files do not
// match its manifest is reported as ErrNotExist and removed.
func (d *Dir) OpenRevision(ctx context.Context, revision string) (Revision, error) {
	digest, err := revisionHex(revision)
	if err != nil {
		return nil, fmt.Errorf("open revision: %w", err)
	}
	path := d.revisionPath(digest)
	if _, err := os.Lstat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open revision %s: %w", revision, ErrNotExist)
		}
		return nil, fmt.Errorf("open revision %s: %w", revision, err)
	}
	l, err := lockFile(ctx, d.revisionLock(digest), lockSH)
	if err != nil {
		return nil, fmt.Errorf("open revision %s: %w", revision, err)
	}
	m, err := readRevision(path, revision)
	if err != nil {
		err = errors.Join(err, l.unlock(false))
		if errors.Is(err, errCorruptRevision) {
			err = errors.Join(err, d.dropCorruptRevision(digest))
		}
		return nil, err
	}
	// Best effort: a reader that does not own the cache cannot set times,
	// and that only costs LRU precision.
	_, _ = d.touchIfPresent(path)
	return &dirRevision{m: m, dir: path, lock: l}, nil
}

// readRevision reads and checks the committed revision directory at path.
func readRevision(path, revision string) (*manifest.Manifest, error) {
	if _, err := os.Lstat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open revision %s: %w", revision, ErrNotExist)
		}
		return nil, fmt.Errorf("open revision %s: %w", revision, err)
	}
	mpath := filepath.Join(path, manifest.FileName)
	data, err := os.ReadFile(mpath)
	if err != nil {
		return nil, fmt.Errorf("open revision %s: %w (%w, %w)", revision, err, errCorruptRevision, ErrNotExist)
	}
	m, err := manifest.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("open revision %s: %s: %w (%w, %w)", revision, mpath, err, errCorruptRevision, ErrNotExist)
	}
	if m.Revision != revision {
		return nil, fmt.Errorf("open revision %s: %s holds revision %s (%w, %w)", revision, mpath, m.Revision, errCorruptRevision, ErrNotExist)
	}
	for _, f := range m.Files {
		fpath := filepath.Join(path, f.Name)
		fi, err := os.Lstat(fpath)
		if err != nil {
			return nil, fmt.Errorf("open revision %s: file %s: %w (%w, %w)", revision, f.Name, err, errCorruptRevision, ErrNotExist)
		}
		if !fi.Mode().IsRegular() || fi.Size() != f.Size {
			return nil, fmt.Errorf("open revision %s: file %s is %v of %d bytes, want a regular file of %d (%w, %w)", revision, f.Name, fi.Mode().Type(), fi.Size(), f.Size, errCorruptRevision, ErrNotExist)
		}
	}
	return m, nil
}

// dropCorruptRevision removes a corrupt revision unless someone has it
// open.
func (d *Dir) dropCorruptRevision(digest string) error {
	l, err := tryLockFile(d.revisionLock(digest), lockEX)
	if err != nil || l == nil {
		return err
	}
	err = d.removeRevisionDir(digest)
	return errors.Join(err, l.unlock(true))
}

// dirRevision is an open revision directory.
type dirRevision struct {
	m   *manifest.Manifest
	dir string

	mu   sync.Mutex
	lock *fileLock
}

// Manifest is the revision's manifest.
func (r *dirRevision) Manifest() *manifest.Manifest { return r.m }

// Dir is revisions/<hex>/ under the cache root.
func (r *dirRevision) Dir() string { return r.dir }

// Close releases the shared lock that keeps the revision from eviction.
func (r *dirRevision) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lock == nil {
		return nil
	}
	err := r.lock.unlock(false)
	r.lock = nil
	return err
}
