//go:build linux

package ctrdcache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/identifiers"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"

	"github.com/stokehq/stoke/weightstore/nodecache"
)

// Defaults for the zero values of Options.
const (
	// DefaultSocket is containerd's usual gRPC socket.
	DefaultSocket = "/run/containerd/containerd.sock"
	// DefaultNamespace is the containerd namespace the cache keeps its
	// content and snapshots in.
	DefaultNamespace = "stoke"
	// DefaultBlobTTL is how long a committed blob that no revision
	// references is kept.
	DefaultBlobTTL = 24 * time.Hour
)

// Snapshotter names New chooses between.
const (
	// Overlayfs is the preferred snapshotter: a view of a revision is a
	// read-only bind mount of its files, so opening one costs no copy.
	Overlayfs = "overlayfs"
	// Native is the fallback: it works on any filesystem but copies the
	// whole revision for every view.
	Native = "native"
)

// ErrInUse reports, from Remove, a revision that has open views; it is
// nodecache.ErrInUse, which Dir.Remove reports too.
var ErrInUse = nodecache.ErrInUse

// Label keys the cache sets on snapshots and leases.
const (
	labelRevision = "stoke.io/revision"             // committed revision: its digest
	labelModel    = "stoke.io/model"                // committed revision: model name
	labelBytes    = "stoke.io/bytes"                // committed revision: total file bytes
	labelManifest = "stoke.io/manifest"             // committed revision: sha256 digest of manifest.json
	labelUsed     = "stoke.io/used"                 // committed revision: last OpenRevision (RFC 3339)
	labelBlob     = "stoke.io/blob"                 // lease of an ingest: the blob's digest
	labelReader   = "stoke.io/reader"               // lease of an open blob: its digest
	labelBuild    = "stoke.io/build"                // lease of a revision build: the revision
	labelView     = "stoke.io/view"                 // lease of a view: the revision
	labelViewKey  = "stoke.io/view-key"             // lease of a view: the view snapshot's key
	labelMount    = "stoke.io/mount"                // view lease, build snapshot: where it is mounted
	labelOwner    = "stoke.io/owner"                // view lease, build snapshot: the process (see owner.go)
	labelGCRoot   = "containerd.io/gc.root"         // containerd: never collected
	labelGCRefPfx = "containerd.io/gc.ref.content." // containerd: references a blob
)

// Options configures a Cache. Zero values mean the defaults.
type Options struct {
	// Socket is containerd's gRPC socket (DefaultSocket).
	Socket string
	// Namespace is the containerd namespace (DefaultNamespace).
	Namespace string
	// Snapshotter holds the revisions. Empty means Overlayfs when the
	// daemon has it working, else Native (see the constants for why).
	Snapshotter string
	// MountDir is where views and revisions being built are mounted, one
	// fresh directory each (os.TempDir()).
	MountDir string
	// BlobTTL is how long a committed blob is kept before a revision
	// references it (DefaultBlobTTL).
	BlobTTL time.Duration
	// DialTimeout bounds connecting to containerd (10s, or less when ctx
	// ends sooner).
	DialTimeout time.Duration
	// MaxBytes is the budget for committed revisions: after each
	// CommitRevision, least recently used revisions without open views
	// are removed until the rest fit (Trim). 0 means unlimited.
	MaxBytes int64
}

// Cache is the containerd node cache. It is safe for concurrent use, and
// several processes may share one containerd namespace.
type Cache struct {
	client      *containerd.Client
	content     content.Store
	snapshots   snapshots.Snapshotter
	leases      leases.Manager
	namespace   string
	snapshotter string
	mountDir    string
	blobTTL     time.Duration
	staleAfter  time.Duration // see reflock.go
	owner       string        // this process, for the owner labels
	maxBytes    int64
}

var _ nodecache.Cache = (*Cache)(nil)

// New connects to containerd and returns the cache kept in its namespace.
func New(ctx context.Context, opts Options) (*Cache, error) {
	if opts.Socket == "" {
		opts.Socket = DefaultSocket
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.MountDir == "" {
		opts.MountDir = os.TempDir()
	}
	if opts.BlobTTL == 0 {
		opts.BlobTTL = DefaultBlobTTL
	}
	if opts.BlobTTL < 0 {
		return nil, fmt.Errorf("containerd node cache: BlobTTL %v is negative", opts.BlobTTL)
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("containerd node cache: MaxBytes %d is negative", opts.MaxBytes)
	}
	if err := identifiers.Validate(opts.Namespace); err != nil {
		return nil, fmt.Errorf("containerd node cache: namespace: %w", err)
	}
	mountDir, err := filepath.Abs(opts.MountDir)
	if err != nil {
		return nil, fmt.Errorf("containerd node cache: mount directory: %w", err)
	}
	opts.MountDir = mountDir
	if err := os.MkdirAll(opts.MountDir, 0o755); err != nil {
		return nil, fmt.Errorf("containerd node cache: mount directory: %w", err)
	}
	timeout := opts.DialTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	client, err := containerd.New(opts.Socket,
		containerd.WithDefaultNamespace(opts.Namespace),
		containerd.WithTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("containerd node cache: connect to %s: %w", opts.Socket, err)
	}
	c := &Cache{
		client:     client,
		content:    client.ContentStore(),
		leases:     client.LeasesService(),
		namespace:  opts.Namespace,
		mountDir:   opts.MountDir,
		blobTTL:    opts.BlobTTL,
		staleAfter: defaultStaleAfter,
		owner:      selfOwner(),
		maxBytes:   opts.MaxBytes,
	}
	c.snapshotter, err = chooseSnapshotter(c.ctx(ctx), client, opts.Snapshotter)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("containerd node cache at %s: %w", opts.Socket, err)
	}
	c.snapshots = client.SnapshotService(c.snapshotter)
	return c, nil
}

// chooseSnapshotter returns want when the daemon has it working, or, when
// want is empty, Overlayfs if it works and else Native.
func chooseSnapshotter(ctx context.Context, client *containerd.Client, want string) (string, error) {
	resp, err := client.IntrospectionService().Plugins(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("list plugins: %w", err)
	}
	working := map[string]bool{}
	broken := map[string]string{}
	for _, p := range resp.Plugins {
		if p.Type != "io.containerd.snapshotter.v1" {
			continue
		}
		if p.InitErr != nil {
			broken[p.ID] = p.InitErr.Message
			continue
		}
		working[p.ID] = true
	}
	candidates := []string{Overlayfs, Native}
	if want != "" {
		candidates = []string{want}
	}
	for _, name := range candidates {
		if working[name] {
			return name, nil
		}
	}
	if want != "" {
		if msg, ok := broken[want]; ok {
			return "", fmt.Errorf("snapshotter %s does not work: %s", want, msg)
		}
		return "", fmt.Errorf("snapshotter %s is not loaded", want)
	}
	return "", fmt.Errorf("neither the %s nor the %s snapshotter works (%v)", Overlayfs, Native, broken)
}

// Snapshotter returns the name of the snapshotter holding the revisions.
func (c *Cache) Snapshotter() string { return c.snapshotter }

// Close closes the connection to containerd. Blobs, writers and views must
// be closed first.
func (c *Cache) Close() error {
	if err := c.client.Close(); err != nil {
		return fmt.Errorf("containerd node cache: close: %w", err)
	}
	return nil
}

// ctx returns ctx in the cache's namespace.
func (c *Cache) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, c.namespace)
}

// cleanupTimeout bounds the containerd calls of Close methods, which have
// no context of their own.
const cleanupTimeout = time.Minute

// cleanupCtx returns a context for releasing resources after ctx may have
// ended.
func (c *Cache) cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.ctx(context.WithoutCancel(ctx)), cleanupTimeout)
}

// deleteLease deletes a lease, ignoring one that is already gone.
func (c *Cache) deleteLease(ctx context.Context, id string) error {
	err := c.leases.Delete(ctx, leases.Lease{ID: id})
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete lease %s: %w", id, err)
	}
	return nil
}

// collectGarbage runs containerd's garbage collector and waits until it
// has deleted what nothing references, by deleting an empty lease
// synchronously.
func (c *Cache) collectGarbage(ctx context.Context) error {
	l, err := c.leases.Create(ctx, leases.WithRandomID())
	if err != nil {
		return fmt.Errorf("collect garbage: %w", err)
	}
	if err := c.leases.Delete(ctx, l, leases.SynchronousDelete); err != nil {
		return fmt.Errorf("collect garbage: %w", err)
	}
	return nil
}

// randomID returns 16 random hex digits.
func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
