//go:build unix

package nodecache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stokehq/stoke/weightstore/manifest"
)

// DefaultOrphanGrace is the OrphanGrace a zero DirOptions.OrphanGrace means.
const DefaultOrphanGrace = 10 * time.Minute

// DirOptions configures a Dir.
type DirOptions struct {
	// MaxBytes is the budget for committed blobs: after each
	// CommitRevision, least recently used revisions are evicted until the
	// blobs fit. 0 means unlimited.
	MaxBytes int64
	// OrphanGrace is how long a committed blob that no revision links
	// (yet) is safe from eviction, so that a load in progress can finish
	// and commit its revision. 0 means DefaultOrphanGrace; negative means
	// none.
	OrphanGrace time.Duration
}

// Dir is the directory implementation of Cache. Everything lives under one
// root, which several processes may share:
//
//	blobs/sha256/<hex>           committed content, read-only (0444)
//	ingest/<hex>.lock            flock held by the one writer of a blob
//	ingest/<hex>.<random>.tmp    content being written
//	revisions/<hex>/             a committed revision (read-only): the
//	                             revision's files, hard links to their blobs,
//	                             and manifest.json; the directory's mtime is
//	                             its last use, for LRU eviction
//	revisions/<hex>.lock         flock: shared while the revision is open,
//	                             exclusive while it is built or evicted
//	revisions/<hex>.tmp-<random> a revision being built
//	revisions/<hex>.del-<random> a revision being evicted
//	evict.lock                   flock held by the one running eviction
//
// where a revision's <hex> is its digest without "sha256:". Blobs and
// revisions appear by rename(2) only, so a crash never leaves half of one
// under its final name; leftovers are cleaned by later writers and
// evictions.
type Dir struct {
	root        string
	maxBytes    int64
	orphanGrace time.Duration
}

var _ Cache = (*Dir)(nil)

// NewDir opens (creating if needed) a directory cache rooted at root.
func NewDir(root string, opts DirOptions) (*Dir, error) {
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("node cache %s: MaxBytes %d is negative", root, opts.MaxBytes)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("node cache %s: %w", root, err)
	}
	d := &Dir{root: abs, maxBytes: opts.MaxBytes, orphanGrace: opts.OrphanGrace}
	if d.orphanGrace == 0 {
		d.orphanGrace = DefaultOrphanGrace
	}
	for _, dir := range []string{d.blobsDir(), d.ingestDir(), d.revisionsDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("node cache %s: %w", root, err)
		}
	}
	return d, nil
}

// Root is the cache's absolute root directory.
func (d *Dir) Root() string { return d.root }

func (d *Dir) blobsDir() string                  { return filepath.Join(d.root, "blobs", "sha256") }
func (d *Dir) ingestDir() string                 { return filepath.Join(d.root, "ingest") }
func (d *Dir) revisionsDir() string              { return filepath.Join(d.root, "revisions") }
func (d *Dir) blobPath(digest string) string     { return filepath.Join(d.blobsDir(), digest) }
func (d *Dir) ingestLock(digest string) string   { return filepath.Join(d.ingestDir(), digest+".lock") }
func (d *Dir) revisionPath(digest string) string { return filepath.Join(d.revisionsDir(), digest) }
func (d *Dir) revisionLock(digest string) string {
	return filepath.Join(d.revisionsDir(), digest+".lock")
}

// checkDigest reports whether s is 64 lowercase hex digits, which is what
// keeps every path built from a digest inside the root.
func checkDigest(s string) error {
	if len(s) != 2*sha256.Size {
		return fmt.Errorf("%q is not a sha256 digest (want %d hex digits)", s, 2*sha256.Size)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("%q is not a sha256 digest (byte %d is %q, want lowercase hex)", s, i, c)
		}
	}
	return nil
}

// checkFile validates the parts of f the cache relies on.
func checkFile(f manifest.File) error {
	if err := checkDigest(f.SHA256); err != nil {
		return fmt.Errorf("file %s: %w", f.Name, err)
	}
	if f.Size < 0 {
		return fmt.Errorf("file %s: size %d is negative", f.Name, f.Size)
	}
	return nil
}

// Open returns the committed blob for f. A blob whose size is not f.Size is
// corrupt: it is removed and Open reports ErrNotExist.
func (d *Dir) Open(ctx context.Context, f manifest.File) (Blob, error) {
	if err := checkFile(f); err != nil {
		return nil, fmt.Errorf("open blob: %w", err)
	}
	path := d.blobPath(f.SHA256)
	file, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open blob %s of %s: %w", f.SHA256, f.Name, ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("open blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("stat blob %s of %s: %w", path, f.Name, err)
	}
	if fi.Size() != f.Size {
		file.Close()
		if err := d.removeCorrupt(ctx, f); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("open blob %s of %s: %d bytes instead of %d, removed: %w", f.SHA256, f.Name, fi.Size(), f.Size, ErrNotExist)
	}
	return &dirBlob{f: file, size: fi.Size()}, nil
}

// removeCorrupt removes f's blob if its size is still wrong once no writer
// holds it.
func (d *Dir) removeCorrupt(ctx context.Context, f manifest.File) error {
	l, err := lockFile(ctx, d.ingestLock(f.SHA256), lockEX)
	if err != nil {
		return fmt.Errorf("remove corrupt blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	_, err = d.removeIfWrongSize(f)
	return errors.Join(err, l.unlock(true))
}

// removeIfWrongSize removes f's blob when its size is not f.Size and
// reports whether the blob is (now) absent. The caller holds the blob's
// ingest lock.
func (d *Dir) removeIfWrongSize(f manifest.File) (absent bool, err error) {
	path := d.blobPath(f.SHA256)
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat blob %s of %s: %w", path, f.Name, err)
	}
	if fi.Mode().IsRegular() && fi.Size() == f.Size {
		return false, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("remove corrupt blob %s of %s: %w", path, f.Name, err)
	}
	return true, nil
}

// dirBlob is a committed blob opened for reading.
type dirBlob struct {
	f    *os.File
	size int64
}

// ReadAt reads from the blob's file.
func (b *dirBlob) ReadAt(p []byte, off int64) (int, error) { return b.f.ReadAt(p, off) }

// Size is the blob's length.
func (b *dirBlob) Size() int64 { return b.size }

// Close closes the blob's file.
func (b *dirBlob) Close() error { return b.f.Close() }

// Create starts ingesting f. It holds ingest/<hex>.lock until the writer is
// committed or closed, so at most one writer per blob exists across all
// processes sharing the root; others wait here. When the blob is already
// committed it returns ErrExists (and marks the blob used, which keeps an
// otherwise unlinked blob safe from eviction for OrphanGrace).
func (d *Dir) Create(ctx context.Context, f manifest.File) (Writer, error) {
	if err := checkFile(f); err != nil {
		return nil, fmt.Errorf("create blob: %w", err)
	}
	l, err := lockFile(ctx, d.ingestLock(f.SHA256), lockEX)
	if err != nil {
		return nil, fmt.Errorf("create blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	w, err := d.startIngest(f, l)
	if err != nil {
		return nil, errors.Join(err, l.unlock(true))
	}
	return w, nil
}

// startIngest is Create once the lock is held.
func (d *Dir) startIngest(f manifest.File, l *fileLock) (*dirWriter, error) {
	absent, err := d.removeIfWrongSize(f)
	if err != nil {
		return nil, err
	}
	if !absent {
		// Best effort: a process that does not own the blob cannot set its
		// times, which only shortens the blob's OrphanGrace.
		now := time.Now()
		_ = os.Chtimes(d.blobPath(f.SHA256), now, now)
		return nil, fmt.Errorf("create blob %s of %s: %w", f.SHA256, f.Name, ErrExists)
	}
	if err := d.removeIngestTemps(f.SHA256); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(d.ingestDir(), f.SHA256+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("create blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	return &dirWriter{d: d, file: f, tmp: tmp, h: sha256.New(), lock: l}, nil
}

// removeIngestTemps removes what killed writers of blob digest left. The
// caller holds the blob's ingest lock.
func (d *Dir) removeIngestTemps(digest string) error {
	names, err := filepath.Glob(filepath.Join(d.ingestDir(), digest+".*.tmp"))
	if err != nil {
		return fmt.Errorf("list leftovers of blob %s: %w", digest, err)
	}
	for _, name := range names {
		if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove leftover %s: %w", name, err)
		}
	}
	return nil
}

// dirWriter writes one blob into a temp file under ingest/, hashing as it
// goes. It is not safe for concurrent use.
type dirWriter struct {
	d    *Dir
	file manifest.File
	tmp  *os.File
	h    hash.Hash
	n    int64
	werr error
	lock *fileLock
	done bool
}

// Sum implements Writer.
func (w *dirWriter) Sum() string { return hex.EncodeToString(w.h.Sum(nil)) }

// Write appends p. Bytes beyond the announced size are counted but not
// stored: Commit will refuse them anyway.
func (w *dirWriter) Write(p []byte) (int, error) {
	if w.done {
		return 0, fmt.Errorf("write blob %s of %s: writer is closed", w.file.SHA256, w.file.Name)
	}
	if w.werr != nil {
		return 0, w.werr
	}
	if w.n+int64(len(p)) > w.file.Size {
		w.n += int64(len(p))
		return len(p), nil
	}
	n, err := w.tmp.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	if err != nil {
		w.werr = fmt.Errorf("write blob %s of %s: %w", w.file.SHA256, w.file.Name, err)
		return n, w.werr
	}
	return n, nil
}

// Commit verifies size and sha256, then publishes the blob with an atomic
// rename and syncs it to disk. On any failure the content is discarded.
func (w *dirWriter) Commit(ctx context.Context) error {
	if w.done {
		return fmt.Errorf("commit blob %s of %s: writer is closed", w.file.SHA256, w.file.Name)
	}
	if err := w.commit(ctx); err != nil {
		return errors.Join(err, w.abandon())
	}
	w.done = true
	return w.lock.unlock(true)
}

func (w *dirWriter) commit(ctx context.Context) error {
	f := w.file
	if w.werr != nil {
		return w.werr
	}
	if sum := hex.EncodeToString(w.h.Sum(nil)); w.n != f.Size || sum != f.SHA256 {
		if w.n != f.Size {
			return fmt.Errorf("commit blob %s of %s: got %d bytes, want %d: %w", f.SHA256, f.Name, w.n, f.Size, ErrDigestMismatch)
		}
		return fmt.Errorf("commit blob %s of %s: content has sha256 %s: %w", f.SHA256, f.Name, sum, ErrDigestMismatch)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("commit blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	tmpPath := w.tmp.Name()
	if err := w.tmp.Chmod(0o444); err != nil {
		return fmt.Errorf("commit blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	if err := w.tmp.Sync(); err != nil {
		return fmt.Errorf("commit blob %s of %s: sync %s: %w", f.SHA256, f.Name, tmpPath, err)
	}
	err := w.tmp.Close()
	w.tmp = nil
	if err != nil {
		return fmt.Errorf("commit blob %s of %s: close %s: %w", f.SHA256, f.Name, tmpPath, err)
	}
	// The mtime of a blob is its last use; see DirOptions.OrphanGrace.
	now := time.Now()
	if err := os.Chtimes(tmpPath, now, now); err != nil {
		return fmt.Errorf("commit blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	if err := os.Rename(tmpPath, w.d.blobPath(f.SHA256)); err != nil {
		return fmt.Errorf("commit blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	if err := syncDir(w.d.blobsDir()); err != nil {
		return fmt.Errorf("commit blob %s of %s: %w", f.SHA256, f.Name, err)
	}
	return nil
}

// Close abandons an uncommitted blob; after Commit it does nothing.
func (w *dirWriter) Close() error {
	if w.done {
		return nil
	}
	return w.abandon()
}

// abandon removes the temp file and releases the lock.
func (w *dirWriter) abandon() error {
	w.done = true
	var errs []error
	if w.tmp != nil {
		name := w.tmp.Name()
		w.tmp.Close()
		w.tmp = nil
		if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("abandon blob %s of %s: %w", w.file.SHA256, w.file.Name, err))
		}
	} else {
		// Closed by commit before it failed: the temp file is still there
		// unless the rename happened.
		if err := w.d.removeIngestTemps(w.file.SHA256); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, w.lock.unlock(true))
	return errors.Join(errs...)
}

// syncDir fsyncs a directory so that renames into it survive a crash.
func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", path, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", path, err)
	}
	return nil
}

// revisionHex returns the hex part of a "sha256:<hex>" revision digest.
func revisionHex(revision string) (string, error) {
	digest, ok := strings.CutPrefix(revision, manifest.RevisionPrefix)
	if !ok {
		return "", fmt.Errorf("revision %q does not start with %q", revision, manifest.RevisionPrefix)
	}
	if err := checkDigest(digest); err != nil {
		return "", fmt.Errorf("revision %q: %w", revision, err)
	}
	return digest, nil
}
