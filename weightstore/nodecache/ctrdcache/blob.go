//go:build linux

package ctrdcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/leases"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/nodecache"
)

// writeChunk is the most one write message carries: containerd refuses
// gRPC messages over 16 MiB unless configured otherwise.
const writeChunk = 4 << 20

// blobDigest validates the parts of f the cache relies on and returns the
// digest of its content.
func blobDigest(f manifest.File) (digest.Digest, error) {
	if err := checkHex(f.SHA256); err != nil {
		return "", fmt.Errorf("file %s: sha256: %w", f.Name, err)
	}
	if f.Size < 0 {
		return "", fmt.Errorf("file %s: size %d is negative", f.Name, f.Size)
	}
	return digest.NewDigestFromEncoded(digest.SHA256, f.SHA256), nil
}

// checkHex reports whether s is 64 lowercase hex digits.
func checkHex(s string) error {
	if len(s) != 64 {
		return fmt.Errorf("%q is not a sha256 digest (want 64 hex digits)", s)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') }); i >= 0 {
		return fmt.Errorf("%q is not a sha256 digest (byte %d is %q, want lowercase hex)", s, i, s[i])
	}
	return nil
}

// blobRef is the ingest ref of a blob: one per blob, so that containerd's
// lock on it makes writers single-flight.
func blobRef(d digest.Digest) string { return "stoke-blob-" + d.String() }

// Open returns the committed blob holding f's content. While the blob is
// open a lease keeps containerd from collecting it. A blob whose size is
// not f.Size is reported as ErrNotExist: containerd verified its digest, so
// it is f that is wrong. Each ReadAt is a round trip to containerd: read in
// pieces of megabytes (loads should read revisions through OpenRevision,
// which is much faster).
func (c *Cache) Open(ctx context.Context, f manifest.File) (nodecache.Blob, error) {
	dgst, err := blobDigest(f)
	if err != nil {
		return nil, fmt.Errorf("open blob: %w", err)
	}
	ctx = c.ctx(ctx)
	lease, err := c.leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(c.blobTTL),
		leases.WithLabels(map[string]string{labelReader: dgst.String()}))
	if err != nil {
		return nil, fmt.Errorf("open blob %s of %s: create lease: %w", dgst, f.Name, err)
	}
	fail := func(err error) (nodecache.Blob, error) {
		cctx, cancel := c.cleanupCtx(ctx)
		defer cancel()
		return nil, errors.Join(err, c.deleteLease(cctx, lease.ID))
	}
	if err := c.leases.AddResource(ctx, lease, leases.Resource{ID: dgst.String(), Type: "content"}); err != nil {
		return fail(fmt.Errorf("open blob %s of %s: lease it: %w", dgst, f.Name, err))
	}
	info, err := c.content.Info(ctx, dgst)
	if errdefs.IsNotFound(err) {
		return fail(fmt.Errorf("open blob %s of %s: %w", dgst, f.Name, nodecache.ErrNotExist))
	}
	if err != nil {
		return fail(fmt.Errorf("open blob %s of %s: %w", dgst, f.Name, err))
	}
	if info.Size != f.Size {
		return fail(fmt.Errorf("open blob %s of %s: it holds %d bytes, not %d: %w", dgst, f.Name, info.Size, f.Size, nodecache.ErrNotExist))
	}
	// Reads happen after Open returns, so they must not end with ctx.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ra, err := c.content.ReaderAt(rctx, ocispec.Descriptor{Digest: dgst, Size: f.Size})
	if err != nil {
		cancel()
		if errdefs.IsNotFound(err) {
			err = nodecache.ErrNotExist
		}
		return fail(fmt.Errorf("open blob %s of %s: %w", dgst, f.Name, err))
	}
	return &blob{c: c, ctx: ctx, ra: ra, size: f.Size, cancel: cancel, lease: lease.ID, name: f.Name, digest: dgst}, nil
}

// blob is an open committed blob.
type blob struct {
	c      *Cache
	ctx    context.Context // for releasing the lease
	ra     content.ReaderAt
	size   int64
	cancel context.CancelFunc // ends reads
	lease  string
	name   string
	digest digest.Digest
	once   sync.Once
	err    error
}

// ReadAt reads len(p) bytes at off, or fewer and io.EOF at the end.
func (b *blob) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read blob %s of %s: negative offset %d", b.digest, b.name, off)
	}
	if off >= b.size {
		return 0, io.EOF
	}
	var eof error
	if rest := b.size - off; int64(len(p)) > rest {
		p, eof = p[:rest], io.EOF
	}
	n, err := b.ra.ReadAt(p, off)
	if err == nil && n < len(p) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		return n, fmt.Errorf("read blob %s of %s at %d: %w", b.digest, b.name, off, errdefs.FromGRPC(err))
	}
	if err == io.EOF && n < len(p) {
		return n, fmt.Errorf("read blob %s of %s at %d: %w", b.digest, b.name, off, io.ErrUnexpectedEOF)
	}
	return n, eof
}

// Size is the blob's length in bytes.
func (b *blob) Size() int64 { return b.size }

// Close ends reads and releases the blob's lease.
func (b *blob) Close() error {
	b.once.Do(func() {
		b.cancel()
		err := b.ra.Close()
		ctx, cancel := b.c.cleanupCtx(b.ctx)
		defer cancel()
		b.err = errors.Join(err, b.c.deleteLease(ctx, b.lease))
		if b.err != nil {
			b.err = fmt.Errorf("close blob %s of %s: %w", b.digest, b.name, b.err)
		}
	})
	return b.err
}

// Create starts ingesting f's content under a lease that expires after
// Options.BlobTTL. While another writer (of this or another process) holds
// the blob, Create waits; when the blob is committed it returns
// ErrExists. An ingest a killed writer left is taken over and truncated
// once it has not changed for a few seconds (see reflock.go).
func (c *Cache) Create(ctx context.Context, f manifest.File) (nodecache.Writer, error) {
	dgst, err := blobDigest(f)
	if err != nil {
		return nil, fmt.Errorf("create blob: %w", err)
	}
	ctx = c.ctx(ctx)
	if _, err := c.content.Info(ctx, dgst); err == nil {
		return nil, fmt.Errorf("create blob %s of %s: %w", dgst, f.Name, nodecache.ErrExists)
	} else if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("create blob %s of %s: %w", dgst, f.Name, err)
	}
	lease, err := c.leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(c.blobTTL),
		leases.WithLabels(map[string]string{labelBlob: dgst.String()}))
	if err != nil {
		return nil, fmt.Errorf("create blob %s of %s: create lease: %w", dgst, f.Name, err)
	}
	// The write stream outlives Create, so it gets its own context.
	sctx, cancel := context.WithCancel(leases.WithLease(context.WithoutCancel(ctx), lease.ID))
	ref := blobRef(dgst)
	isCommitted := func(ctx context.Context) (bool, error) {
		_, err := c.content.Info(ctx, dgst)
		if errdefs.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}
	cw, exists, err := c.acquire(ctx, sctx, cancel, ref, ocispec.Descriptor{Digest: dgst, Size: f.Size}, isCommitted)
	if exists || errdefs.IsAlreadyExists(err) {
		err = nodecache.ErrExists
	}
	if err != nil {
		cancel()
		cctx, ccancel := c.cleanupCtx(ctx)
		defer ccancel()
		return nil, errors.Join(fmt.Errorf("create blob %s of %s: %w", dgst, f.Name, err), c.deleteLease(cctx, lease.ID))
	}
	w := &writer{c: c, ctx: ctx, f: f, digest: dgst, ref: ref, lease: lease.ID, cw: cw, cancel: cancel}
	// A writer killed earlier may have left content under the ref: start
	// over (containerd truncates on the first write at offset 0).
	if err := cw.Truncate(0); err != nil {
		return nil, errors.Join(fmt.Errorf("create blob %s of %s: truncate: %w", dgst, f.Name, err), w.abandon())
	}
	return w, nil
}

// Writer states.
const (
	writing = iota
	committed
	closed
)

// writer ingests one blob.
type writer struct {
	c      *Cache
	ctx    context.Context // Create's, for releasing the lease
	f      manifest.File
	digest digest.Digest
	ref    string
	lease  string
	cw     content.Writer
	cancel context.CancelFunc // ends the write stream
	n      int64
	state  int
	err    error // the first write error
}

// Sum implements nodecache.Writer with the digest containerd computed of
// what it received.
func (w *writer) Sum() string { return w.cw.Digest().Encoded() }

// Write sends p to containerd in chunks.
func (w *writer) Write(p []byte) (int, error) {
	switch {
	case w.state != writing:
		return 0, fmt.Errorf("write blob %s of %s: writer is committed or closed", w.digest, w.f.Name)
	case w.err != nil:
		return 0, w.err
	case int64(len(p)) > w.f.Size-w.n:
		w.err = fmt.Errorf("write blob %s of %s: more than its %d bytes: %w", w.digest, w.f.Name, w.f.Size, nodecache.ErrDigestMismatch)
		return 0, w.err
	}
	total := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), writeChunk)]
		n, err := w.cw.Write(chunk)
		total += n
		w.n += int64(n)
		if err != nil {
			w.err = fmt.Errorf("write blob %s of %s at %d: %w", w.digest, w.f.Name, w.n, err)
			return total, w.err
		}
		p = p[n:]
	}
	return total, nil
}

// Commit has containerd check the size and digest and publish the blob.
// The lease stays: it keeps the blob until a revision references it.
func (w *writer) Commit(ctx context.Context) error {
	switch w.state {
	case committed:
		return nil
	case closed:
		return fmt.Errorf("commit blob %s of %s: writer is closed", w.digest, w.f.Name)
	}
	if w.err != nil {
		return errors.Join(w.err, w.abandon())
	}
	if w.n != w.f.Size {
		err := fmt.Errorf("commit blob %s of %s: %d bytes written, want %d: %w", w.digest, w.f.Name, w.n, w.f.Size, nodecache.ErrDigestMismatch)
		return errors.Join(err, w.abandon())
	}
	stop := context.AfterFunc(ctx, w.cancel)
	err := w.cw.Commit(ctx, w.f.Size, w.digest)
	stop()
	switch {
	case err == nil:
		w.state = committed
		w.cancel()
		return nil
	case errdefs.IsAlreadyExists(err):
		// Committed meanwhile by a writer that did not take our ref.
		w.state = committed
		w.cancel()
		cctx, cancel := w.c.cleanupCtx(w.ctx)
		defer cancel()
		return w.c.deleteLease(cctx, w.lease)
	case ctx.Err() != nil:
		return errors.Join(fmt.Errorf("commit blob %s of %s: %w", w.digest, w.f.Name, ctx.Err()), w.abandon())
	case errdefs.IsFailedPrecondition(err):
		// containerd's "unexpected commit size" or "unexpected commit digest".
		err = fmt.Errorf("commit blob %s of %s: %v: %w", w.digest, w.f.Name, err, nodecache.ErrDigestMismatch)
		return errors.Join(err, w.abandon())
	default:
		return errors.Join(fmt.Errorf("commit blob %s of %s: %w", w.digest, w.f.Name, err), w.abandon())
	}
}

// Close abandons the content unless it was committed.
func (w *writer) Close() error {
	if w.state != writing {
		return nil
	}
	return w.abandon()
}

// abandon discards the ingest, ends the write stream, which frees the ref
// for the next writer, and deletes the lease.
func (w *writer) abandon() error {
	w.state = closed
	ctx, cancel := w.c.cleanupCtx(w.ctx)
	defer cancel()
	// Abort before closing: once the ref is free, the ingest may be the
	// next writer's.
	aerr := w.c.content.Abort(ctx, w.ref)
	if errdefs.IsNotFound(aerr) {
		aerr = nil
	}
	w.cw.Close()
	w.cancel()
	if err := errors.Join(aerr, w.c.deleteLease(ctx, w.lease)); err != nil {
		return fmt.Errorf("abandon blob %s of %s: %w", w.digest, w.f.Name, err)
	}
	return nil
}
