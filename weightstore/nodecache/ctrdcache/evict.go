//go:build linux

package ctrdcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/snapshots"

	"github.com/stokehq/stoke/weightstore/nodecache"
)

// RevisionInfo describes a committed revision.
type RevisionInfo struct {
	// Revision is the revision's digest.
	Revision string
	// Model is the model's name.
	Model string
	// Bytes is the total size of the revision's files (its snapshot; its
	// blobs take as much again while they are alive).
	Bytes int64
	// Created is when the revision was committed.
	Created time.Time
	// LastUsed is when it was last opened (or committed).
	LastUsed time.Time
	// Views counts its open views, including any a killed process left
	// that Remove has not reclaimed yet.
	Views int
}

// Revisions lists the committed revisions, least recently used first.
func (c *Cache) Revisions(ctx context.Context) ([]RevisionInfo, error) {
	ctx = c.ctx(ctx)
	views, err := c.leases.List(ctx, labelFilter(labelView, ""))
	if err != nil {
		return nil, fmt.Errorf("list revisions: list views: %w", err)
	}
	open := map[string]int{}
	for _, l := range views {
		open[l.Labels[labelView]]++
	}
	var revs []RevisionInfo
	err = c.snapshots.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		rev := info.Labels[labelRevision]
		if info.Kind != snapshots.KindCommitted || info.Name != revisionName(rev) {
			return nil
		}
		r := RevisionInfo{
			Revision: rev,
			Model:    info.Labels[labelModel],
			Created:  info.Created,
			LastUsed: info.Created,
			Views:    open[rev],
		}
		r.Bytes, _ = strconv.ParseInt(info.Labels[labelBytes], 10, 64)
		if t, err := time.Parse(time.RFC3339Nano, info.Labels[labelUsed]); err == nil {
			r.LastUsed = t
		}
		revs = append(revs, r)
		return nil
	}, labelFilter(labelRevision, ""))
	if err != nil {
		return nil, fmt.Errorf("list revisions: %w", err)
	}
	slices.SortFunc(revs, func(a, b RevisionInfo) int {
		if n := a.LastUsed.Compare(b.LastUsed); n != 0 {
			return n
		}
		return strings.Compare(a.Revision, b.Revision)
	})
	return revs, nil
}

// Remove removes a committed revision and releases its blobs, then runs
// containerd's garbage collector, which deletes the snapshot and the blobs
// that no other revision references, before Remove returns. Views that killed processes left are reclaimed first;
// a revision with live views is not removed (ErrInUse). A revision that is
// not there is ErrNotExist.
//
// A load that committed one of these blobs, or found it committed, and has
// yet to commit its own revision may see CommitRevision report the blob
// missing (ErrNotExist), and must fetch it again.
func (c *Cache) Remove(ctx context.Context, revision string) error {
	if err := checkRevision(revision); err != nil {
		return fmt.Errorf("remove revision: %w", err)
	}
	ctx = c.ctx(ctx)
	info, ok, err := c.committed(ctx, revision)
	if err != nil {
		return fmt.Errorf("remove revision: %w", err)
	}
	if !ok {
		return fmt.Errorf("remove revision %s: %w", revision, nodecache.ErrNotExist)
	}
	live, err := c.reclaimViews(ctx, revision)
	if err != nil {
		return fmt.Errorf("remove revision %s: %w", revision, err)
	}
	if err := c.snapshots.Remove(ctx, revisionName(revision)); err != nil {
		switch {
		case errdefs.IsNotFound(err):
			return fmt.Errorf("remove revision %s: %w", revision, nodecache.ErrNotExist)
		case errdefs.IsFailedPrecondition(err):
			return fmt.Errorf("remove revision %s: %d open views (%v): %w", revision, live, err, ErrInUse)
		}
		return fmt.Errorf("remove revision %s: %w", revision, err)
	}
	blobs := map[string]bool{}
	for k, v := range info.Labels {
		if strings.HasPrefix(k, labelGCRefPfx) {
			blobs[v] = true
		}
	}
	if err := c.releaseBlobs(ctx, blobs); err != nil {
		return fmt.Errorf("remove revision %s: %w", revision, err)
	}
	if err := c.collectGarbage(ctx); err != nil {
		return fmt.Errorf("remove revision %s: %w", revision, err)
	}
	return nil
}

// reclaimViews removes the views of revision whose owners are gone, with
// their mounts, and returns how many views are left.
func (c *Cache) reclaimViews(ctx context.Context, revision string) (int, error) {
	ls, err := c.leases.List(ctx, labelFilter(labelView, revision))
	if err != nil {
		return 0, fmt.Errorf("list views: %w", err)
	}
	live := 0
	for _, l := range ls {
		if !c.ownerGone(l.Labels[labelOwner]) {
			live++
			continue
		}
		if err := c.unmountStale(l.Labels[labelMount]); err != nil {
			return 0, fmt.Errorf("stale view %s: %w", l.ID, err)
		}
		if key := l.Labels[labelViewKey]; key != "" {
			if err := c.snapshots.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
				return 0, fmt.Errorf("remove stale view %s: %w", key, err)
			}
		}
		if err := c.deleteLease(ctx, l.ID); err != nil {
			return 0, err
		}
	}
	return live, nil
}

// releaseBlobs deletes the ingest leases of the given blobs, so that only
// revisions referencing them keep them.
func (c *Cache) releaseBlobs(ctx context.Context, blobs map[string]bool) error {
	if len(blobs) == 0 {
		return nil
	}
	ls, err := c.leases.List(ctx, labelFilter(labelBlob, ""))
	if err != nil {
		return fmt.Errorf("list blob leases: %w", err)
	}
	var errs []error
	for _, l := range ls {
		if blobs[l.Labels[labelBlob]] {
			errs = append(errs, c.deleteLease(ctx, l.ID))
		}
	}
	return errors.Join(errs...)
}

// Trim removes least recently used revisions without live views until the
// revisions' files fit in maxBytes, and returns the removed revisions.
// Blobs are not counted: those of removed revisions go with them, and the
// others expire after Options.BlobTTL.
func (c *Cache) Trim(ctx context.Context, maxBytes int64) ([]string, error) {
	return c.trim(ctx, maxBytes, "")
}

// trim is Trim sparing the revision keep.
func (c *Cache) trim(ctx context.Context, maxBytes int64, keep string) ([]string, error) {
	revs, err := c.Revisions(ctx)
	if err != nil {
		return nil, fmt.Errorf("trim: %w", err)
	}
	var total int64
	for _, r := range revs {
		total += r.Bytes
	}
	var removed []string
	for _, r := range revs {
		if total <= maxBytes {
			break
		}
		if r.Revision == keep {
			continue
		}
		err := c.Remove(ctx, r.Revision)
		switch {
		case err == nil:
			removed = append(removed, r.Revision)
			total -= r.Bytes
		case errors.Is(err, ErrInUse):
		case errors.Is(err, nodecache.ErrNotExist):
			total -= r.Bytes // removed meanwhile by someone else
		default:
			return removed, fmt.Errorf("trim: %w", err)
		}
	}
	return removed, nil
}
