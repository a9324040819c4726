//go:build unix

package nodecache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/stokehq/stoke/weightstore/manifest"
)

// blobInfo is what eviction needs to know of a committed blob.
type blobInfo struct {
	digest string
	size   int64
	nlink  uint64
	mtime  time.Time
}

// revisionInfo is a committed revision and its last use.
type revisionInfo struct {
	digest string
	mtime  time.Time
}

// Usage is the number of bytes held by committed blobs, which is what
// MaxBytes budgets.
func (d *Dir) Usage() (int64, error) {
	blobs, err := d.listBlobs()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, b := range blobs {
		total += b.size
	}
	return total, nil
}

// Evict removes what killed writers and committers left behind and, when
// the blobs exceed MaxBytes, evicts until they fit: first blobs no revision
// links (older than OrphanGrace), oldest first; then least recently used
// revisions that nobody has open, with the blobs only they linked. Blobs
// being ingested and revisions open in any process are skipped, so usage
// may stay above the budget. CommitRevision calls it.
func (d *Dir) Evict(ctx context.Context) error {
	return d.evict(ctx, "")
}

// evict is Evict sparing the revision keep.
func (d *Dir) evict(ctx context.Context, keep string) error {
	path := filepath.Join(d.root, "evict.lock")
	l, err := lockFile(ctx, path, lockEX)
	if err != nil {
		return fmt.Errorf("evict from %s: %w", d.root, err)
	}
	defer l.unlock(false)

	errs := []error{d.sweep()}
	if d.maxBytes > 0 {
		errs = append(errs, d.enforceBudget(keep))
	}
	return errors.Join(errs...)
}

// enforceBudget evicts down to MaxBytes. The caller holds evict.lock.
func (d *Dir) enforceBudget(keep string) error {
	blobs, err := d.listBlobs()
	if err != nil {
		return err
	}
	var total int64
	for _, b := range blobs {
		total += b.size
	}
	if total <= d.maxBytes {
		return nil
	}
	var errs []error

	cutoff := time.Now()
	if d.orphanGrace > 0 {
		cutoff = cutoff.Add(-d.orphanGrace)
	}
	var orphans []blobInfo
	for _, b := range blobs {
		if b.nlink == 1 && !b.mtime.After(cutoff) {
			orphans = append(orphans, b)
		}
	}
	slices.SortFunc(orphans, func(a, b blobInfo) int {
		return cmp.Or(a.mtime.Compare(b.mtime), strings.Compare(a.digest, b.digest))
	})
	for _, b := range orphans {
		if total <= d.maxBytes {
			return errors.Join(errs...)
		}
		freed, err := d.removeUnlinkedBlob(b.digest, cutoff)
		errs = append(errs, err)
		total -= freed
	}

	revs, err := d.listRevisions()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, r := range revs {
		if total <= d.maxBytes {
			break
		}
		if r.digest == keep {
			continue
		}
		// Blobs marked used after this instant (by Create finding them)
		// belong to a load in progress and stay.
		start := time.Now()
		digests, err := d.evictRevision(r)
		errs = append(errs, err)
		for _, digest := range digests {
			freed, err := d.removeUnlinkedBlob(digest, start)
			errs = append(errs, err)
			total -= freed
		}
	}
	return errors.Join(errs...)
}

// removeUnlinkedBlob removes blob digest if no revision links it, it is
// not being ingested and it was last used no later than cutoff. It returns
// the bytes freed.
func (d *Dir) removeUnlinkedBlob(digest string, cutoff time.Time) (int64, error) {
	l, err := tryLockFile(d.ingestLock(digest), lockEX)
	if err != nil || l == nil {
		return 0, err
	}
	freed, err := d.removeUnlinkedBlobLocked(digest, cutoff)
	return freed, errors.Join(err, l.unlock(true))
}

func (d *Dir) removeUnlinkedBlobLocked(digest string, cutoff time.Time) (int64, error) {
	path := d.blobPath(digest)
	b, err := statBlob(path, digest)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("evict blob %s: %w", digest, err)
	}
	if b.nlink != 1 || b.mtime.After(cutoff) {
		return 0, nil
	}
	if err := os.Remove(path); err != nil {
		return 0, fmt.Errorf("evict blob %s: %w", digest, err)
	}
	return b.size, nil
}

// evictRevision removes revision r unless it is open or was used since it
// was listed, and returns the digests of its blobs.
func (d *Dir) evictRevision(r revisionInfo) ([]string, error) {
	l, err := tryLockFile(d.revisionLock(r.digest), lockEX)
	if err != nil || l == nil {
		return nil, err
	}
	digests, err := d.evictRevisionLocked(r)
	return digests, errors.Join(err, l.unlock(true))
}

func (d *Dir) evictRevisionLocked(r revisionInfo) ([]string, error) {
	path := d.revisionPath(r.digest)
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("evict revision %s: %w", r.digest, err)
	}
	if !fi.ModTime().Equal(r.mtime) {
		return nil, nil
	}
	var digests []string
	// A manifest that cannot be read leaves the blobs to a later pass as
	// orphans.
	if data, err := os.ReadFile(filepath.Join(path, manifest.FileName)); err == nil {
		if m, err := manifest.Parse(data); err == nil {
			for _, f := range m.Files {
				if !slices.Contains(digests, f.SHA256) {
					digests = append(digests, f.SHA256)
				}
			}
		}
	}
	if err := d.removeRevisionDir(r.digest); err != nil {
		return nil, fmt.Errorf("evict revision %s: %w", r.digest, err)
	}
	return digests, nil
}

// listBlobs stats every committed blob.
func (d *Dir) listBlobs() ([]blobInfo, error) {
	entries, err := os.ReadDir(d.blobsDir())
	if err != nil {
		return nil, fmt.Errorf("list blobs: %w", err)
	}
	blobs := make([]blobInfo, 0, len(entries))
	for _, e := range entries {
		if checkDigest(e.Name()) != nil {
			continue
		}
		b, err := statBlob(filepath.Join(d.blobsDir(), e.Name()), e.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list blobs: %w", err)
		}
		blobs = append(blobs, b)
	}
	return blobs, nil
}

// statBlob reads a blob's size, link count and last use.
func statBlob(path, digest string) (blobInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return blobInfo{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return blobInfo{}, fmt.Errorf("stat %s: no link count", path)
	}
	return blobInfo{digest: digest, size: fi.Size(), nlink: uint64(st.Nlink), mtime: fi.ModTime()}, nil
}

// listRevisions lists committed revisions, least recently used first.
func (d *Dir) listRevisions() ([]revisionInfo, error) {
	entries, err := os.ReadDir(d.revisionsDir())
	if err != nil {
		return nil, fmt.Errorf("list revisions: %w", err)
	}
	var revs []revisionInfo
	for _, e := range entries {
		if !e.IsDir() || checkDigest(e.Name()) != nil {
			continue
		}
		fi, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list revisions: %w", err)
		}
		revs = append(revs, revisionInfo{digest: e.Name(), mtime: fi.ModTime()})
	}
	slices.SortFunc(revs, func(a, b revisionInfo) int {
		return cmp.Or(a.mtime.Compare(b.mtime), strings.Compare(a.digest, b.digest))
	})
	return revs, nil
}

// sweep removes leftovers: revisions half-built or half-deleted, temp
// files of killed writers, and lock files nobody holds. The caller holds
// evict.lock.
func (d *Dir) sweep() error {
	var errs []error
	entries, err := os.ReadDir(d.revisionsDir())
	if err != nil {
		return fmt.Errorf("sweep revisions: %w", err)
	}
	committed := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() && checkDigest(e.Name()) == nil {
			committed[e.Name()] = true
		}
	}
	// Revisions being built or removed are under their lock, held
	// exclusively; with the lock free, what is left is debris.
	var revLocks []string
	for _, e := range entries {
		digest, rest, ok := splitDigest(e.Name())
		if !ok || rest == ".lock" && committed[digest] || slices.Contains(revLocks, digest) {
			continue
		}
		if rest == ".lock" || strings.HasPrefix(rest, ".tmp-") || strings.HasPrefix(rest, ".del-") {
			revLocks = append(revLocks, digest)
		}
	}
	for _, digest := range revLocks {
		l, err := tryLockFile(d.revisionLock(digest), lockEX)
		if err != nil || l == nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, d.removeRevisionTemps(digest), l.unlock(!committed[digest]))
	}

	entries, err = os.ReadDir(d.ingestDir())
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("sweep ingest: %w", err))...)
	}
	var blobs []string
	for _, e := range entries {
		if digest, _, ok := splitDigest(e.Name()); ok && !slices.Contains(blobs, digest) {
			blobs = append(blobs, digest)
		}
	}
	for _, digest := range blobs {
		l, err := tryLockFile(d.ingestLock(digest), lockEX)
		if err != nil || l == nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, d.removeIngestTemps(digest), l.unlock(true))
	}
	return errors.Join(errs...)
}

// splitDigest splits "<digest>.<rest>" into the digest and ".<rest>".
func splitDigest(name string) (digest, rest string, ok bool) {
	const n = 64
	if len(name) <= n || name[n] != '.' || checkDigest(name[:n]) != nil {
		return "", "", false
	}
	return name[:n], name[n:], true
}

// Remove drops a revision from the cache, and the blobs no other revision
// holds. A revision that is open is left alone: the error wraps ErrInUse.
func (d *Dir) Remove(ctx context.Context, revision string) error {
	digest, err := revisionHex(revision)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(d.revisionPath(digest))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove revision %s: %w", revision, ErrNotExist)
	}
	if err != nil {
		return fmt.Errorf("remove revision %s: %w", revision, err)
	}
	blobs, err := d.evictRevision(revisionInfo{digest: digest, mtime: fi.ModTime()})
	if err != nil {
		return err
	}
	if _, err := os.Lstat(d.revisionPath(digest)); err == nil {
		return fmt.Errorf("remove revision %s: %w", revision, ErrInUse)
	}
	cutoff := time.Now().Add(time.Second)
	for _, b := range blobs {
		if _, err := d.removeUnlinkedBlob(b, cutoff); err != nil {
			return err
		}
	}
	return nil
}
