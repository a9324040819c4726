// Package ctrdcache is the containerd implementation of the node cache
// (nodecache.Cache): revision files are kept as blobs in containerd's
// content store, and each committed revision is a committed snapshot that
// holds the revision's files and manifest.json, mounted read-only for
// whoever opens it. Linux only; it needs root to mount snapshots.
//
// What lives in containerd, in the cache's namespace (default "stoke"):
//
//	content sha256:<hex>          a blob, verified by containerd at commit
//	ingest  stoke-blob-sha256:<hex>  a blob being written; containerd's
//	                              lock on the ref makes writers single-flight
//	snapshot stoke/rev/<revision> a committed revision: labels name the
//	                              revision, model, size, manifest digest and
//	                              last use, hold the gc root, and reference
//	                              every blob (containerd.io/gc.ref.content.<n>)
//	snapshot stoke/prep/<revision> a revision being built; never opened
//	snapshot stoke/view/<revision>/<id> an open view of a revision
//	ingest  stoke-lock-<revision> a lock held while a revision is built
//
// Writers of a blob, and builders of a revision, are single-flight across
// processes through containerd's lock on the ingest ref (see reflock.go).
//
// Lifetimes. A blob is written and committed under a lease that expires
// after Options.BlobTTL, which keeps it between its commit and the commit of
// a revision that references it; from then on the revision's gc references
// keep it. A committed revision is a gc root until Remove, which also
// releases its blobs and runs the garbage collector. A view holds a lease
// (without expiry) and is a child of its revision, so a revision with open
// views cannot be removed. Whatever a killed process leaves (a half-written
// ingest, a half-built revision, a view and its mount when the process is
// known to be gone: same boot and PID namespace) is reclaimed by the
// next writer of the same blob, builder of the same revision, or Remove of
// the revision, or by containerd's garbage collector once its lease expires.
//
// Disk use: a revision's files are copied into its snapshot, so a cached
// revision takes its size twice while its blobs are alive (until Remove).
// Trim removes least recently used revisions down to a byte budget; nothing
// evicts on its own.
//
// Speed: blobs go through containerd's gRPC API (a few hundred MB/s on
// small machines; containerd hashes them at commit), while a revision view
// is a read-only bind mount (overlayfs) that reads at file-system speed.
package ctrdcache
