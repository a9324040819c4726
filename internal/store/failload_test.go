package store

import (
	"context"
	"errors"
	"testing"
)

// TestFailLoadedRevision: a ready revision that does not load moves to
// failed with its reason, once; validating ones and unknown ones are
// refused, and validation still cannot leave ready.
func TestFailLoadedRevision(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		for _, d := range []string{"sha256:a", "sha256:b"} {
			if _, err := s.PutRevision(ctx, Revision{Model: "m", Digest: d}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.FailLoadedRevision(ctx, "m", "sha256:a", "load failed"); !errors.Is(err, ErrIllegalTransition) {
			t.Errorf("from validating: %v, want ErrIllegalTransition", err)
		}
		if err := s.FailLoadedRevision(ctx, "m", "sha256:zz", "load failed"); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown revision: %v, want ErrNotFound", err)
		}
		if err := s.SetRevisionState(ctx, "m", "sha256:a", RevisionReady, ""); err != nil {
			t.Fatal(err)
		}
		if err := s.FailLoadedRevision(ctx, "m", "sha256:a", ""); !errors.Is(err, ErrInvalid) {
			t.Errorf("no reason: %v, want ErrInvalid", err)
		}
		if err := s.FailLoadedRevision(ctx, "m", "sha256:a", "load failed 3 times"); err != nil {
			t.Fatal(err)
		}
		if err := s.FailLoadedRevision(ctx, "m", "sha256:a", "again"); err != nil {
			t.Errorf("already failed: %v, want nil", err)
		}
		r, err := s.Revision(ctx, "m", "sha256:a")
		if err != nil || r.State != RevisionFailed || r.Reason != "load failed 3 times" {
			t.Errorf("revision %+v, %v; want failed with the first reason", r, err)
		}
		if _, err := s.LatestReady(ctx, "m"); !errors.Is(err, ErrNotFound) {
			t.Errorf("LatestReady after the failure: %v, want ErrNotFound", err)
		}
	})
}
