// Package nodecache is the node-local weight cache: revision files kept by
// their sha256 so that the next load of a revision on this node streams
// from local storage (tier T2) instead of the bucket (T3).
//
// Two implementations share the Cache interface: a directory cache (this
// package's Dir) with atomic renames and an LRU size budget, and a
// containerd one (package ctrdcache) that keeps blobs in containerd's
// content store and each revision as a committed snapshot.
//
// Content is verified once, when it is committed: Commit refuses a blob
// whose size or sha256 differs from what was announced, so whatever Open
// and OpenRevision return can be read without hashing again.
package nodecache

import (
	"context"
	"errors"
	"io"

	"github.com/stokehq/stoke/weightstore/manifest"
)

// Sentinel errors, matched with errors.Is. Read-only.
var (
	// ErrNotExist reports a blob or revision the cache does not hold.
	ErrNotExist = errors.New("not in the node cache")
	// ErrExists reports, from Create, a blob that is already committed
	// (possibly by a concurrent writer that Create waited for).
	ErrExists = errors.New("already in the node cache")
	// ErrDigestMismatch reports, from Commit, content whose size or sha256
	// is not the announced one. The content is discarded.
	ErrDigestMismatch = errors.New("content does not match its digest")
	// ErrInUse reports a revision that cannot be removed while it is open.
	ErrInUse = errors.New("revision in use")
)

// Cache is a content-addressed store of revision files on this node.
// Implementations are safe for concurrent use by goroutines and by other
// processes sharing the same cache.
type Cache interface {
	// Open returns the committed blob holding f's content, or an error
	// wrapping ErrNotExist.
	Open(ctx context.Context, f manifest.File) (Blob, error)
	// Create starts ingesting f's content. Writers are single-flight per
	// blob across processes: while another writer ingests the same blob,
	// Create waits (until ctx ends); when the blob is committed, by then or
	// before, it returns an error wrapping ErrExists.
	Create(ctx context.Context, f manifest.File) (Writer, error)
	// CommitRevision records that every file of m is committed and makes
	// the revision available to OpenRevision. A missing blob is an error
	// wrapping ErrNotExist.
	CommitRevision(ctx context.Context, m *manifest.Manifest) error
	// OpenRevision returns a read-only view of a committed revision, or
	// an error wrapping ErrNotExist. While the view is open the revision is
	// not evicted.
	OpenRevision(ctx context.Context, revision string) (Revision, error)
}

// Blob is committed, verified content.
type Blob interface {
	io.ReaderAt
	// Size is the blob's length in bytes.
	Size() int64
	// Close releases the blob.
	Close() error
}

// Writer receives a blob's content in order.
type Writer interface {
	io.Writer
	// Sum is the lowercase hex sha256 of the bytes written so far, so a
	// caller that must check the content before Commit need not hash it a
	// second time.
	Sum() string
	// Commit checks the size and sha256 of what was written and publishes
	// the blob atomically; on a mismatch it discards the content and
	// returns an error wrapping ErrDigestMismatch. A blob committed
	// meanwhile by another writer is not an error.
	Commit(ctx context.Context) error
	// Close abandons the content unless it was committed; it is safe to
	// call after Commit.
	Close() error
}

// Revision is a read-only view of a cached revision: a directory holding
// the revision's files under their names, which runtimes read (or mount)
// directly.
type Revision interface {
	// Manifest is the revision's manifest.
	Manifest() *manifest.Manifest
	// Dir is the directory holding the files, read-only.
	Dir() string
	// Close releases the view; Dir must not be used afterwards.
	Close() error
}
