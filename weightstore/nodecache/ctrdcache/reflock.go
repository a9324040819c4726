//go:build linux

package ctrdcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Writers are single-flight through containerd's lock on an ingest ref:
// whoever holds a write stream open on the ref holds the lock, and the lock
// goes with the stream when its process dies.
//
// Asking for a lock that is held is expensive: containerd's content store
// retries it for up to about a second inside a metadata write transaction,
// stalling every other metadata write of the daemon meanwhile. So waiters
// do not ask while the ref looks busy: they poll the ingest's status (a
// read) and ask only when there is no ingest or when it has not changed for
// staleAfter; after a refusal they wait staleAfter again. Holders keep
// their ingest changing: blob writers by writing, the build lock by a
// heartbeat.

// Defaults of the polling.
const (
	// defaultStaleAfter is how long an ingest must stay unchanged before a
	// waiter asks for its lock.
	defaultStaleAfter = 5 * time.Second
	// heartbeatEvery is how often the build lock touches its ingest.
	heartbeatEvery = time.Second
	// Bounds of the interval between two polls of a busy ref.
	pollMin = 5 * time.Millisecond
	pollMax = 250 * time.Millisecond
)

// acquire opens a content writer on ref, whose write stream runs under
// sctx and so holds containerd's lock on ref until the writer is closed or
// sctx is cancelled. While another writer holds the lock it waits, until
// ctx ends (which also cancels sctx through cancel) or done reports true,
// which acquire then returns with a nil writer.
func (c *Cache) acquire(ctx, sctx context.Context, cancel context.CancelFunc, ref string, desc ocispec.Descriptor, done func(context.Context) (bool, error)) (content.Writer, bool, error) {
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	var (
		poll        = pollMin
		last        content.Status // the ingest as last seen
		lastChanged time.Time      // when it was seen to change, locally
		refusedAt   time.Time      // when the lock was last refused
	)
	for {
		if ok, err := done(ctx); err != nil || ok {
			return nil, ok, err
		}
		st, err := c.content.Status(ctx, ref)
		switch {
		case errdefs.IsNotFound(err):
			st = content.Status{}
		case err != nil:
			return nil, false, fmt.Errorf("status of %s: %w", ref, err)
		}
		now := time.Now()
		if st.Offset != last.Offset || !st.UpdatedAt.Equal(last.UpdatedAt) || lastChanged.IsZero() {
			last, lastChanged = st, now
		}
		idle := st.Ref == "" ||
			now.Sub(st.UpdatedAt) > c.staleAfter ||
			now.Sub(lastChanged) > c.staleAfter
		if idle && now.Sub(refusedAt) > c.staleAfter {
			cw, err := c.content.Writer(sctx, content.WithRef(ref), content.WithDescriptor(desc))
			switch {
			case err == nil && ctx.Err() != nil:
				cw.Close()
				return nil, false, ctx.Err()
			case err == nil:
				return cw, false, nil
			case ctx.Err() != nil:
				return nil, false, ctx.Err()
			case errdefs.IsAlreadyExists(err):
				return nil, false, err
			case !errdefs.IsUnavailable(err):
				return nil, false, fmt.Errorf("open writer on %s: %w", ref, err)
			}
			refusedAt = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, false, fmt.Errorf("wait for the writer holding %s: %w", ref, ctx.Err())
		case <-time.After(poll/2 + rand.N(poll/2+1)):
		}
		poll = min(2*poll, pollMax)
	}
}

// heartbeat rewrites one byte of a held lock's ingest every heartbeatEvery,
// so that waiters see it busy, until the returned stop is called.
func heartbeat(cw content.Writer) (stop func()) {
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				// Writing at offset 0 truncates first, so the ingest
				// stays one byte long. A failure means the stream is
				// gone, and with it the lock: nothing to keep alive.
				if cw.Truncate(0) != nil {
					return
				}
				if _, err := cw.Write([]byte{0}); err != nil {
					return
				}
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}
