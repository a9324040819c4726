package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock returns a clock that ticks one second per call.
func fakeClock() func() time.Time {
	t := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	var mu sync.Mutex
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

func TestPutRevisionIsIdempotent(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		s.now = fakeClock()
		first := Revision{Model: "llama", Digest: "sha256:aa", Source: "s3://models/llama", Manifest: []byte(`{"model":"llama"}`),
			State: RevisionReady, Reason: "ignored"}
		created, err := s.PutRevision(ctx, first)
		if err != nil || !created {
			t.Fatalf("first put: created=%v err=%v", created, err)
		}
		got, err := s.Revision(ctx, "llama", "sha256:aa")
		if err != nil {
			t.Fatal(err)
		}
		if got.State != RevisionValidating || got.Reason != "" {
			t.Errorf("new revision state=%s reason=%q, want validating with no reason", got.State, got.Reason)
		}
		if got.Source != first.Source || string(got.Manifest) != string(first.Manifest) {
			t.Errorf("stored source=%q manifest=%s, want %q %s", got.Source, got.Manifest, first.Source, first.Manifest)
		}
		if got.CreatedAt.IsZero() || !got.CreatedAt.Equal(got.UpdatedAt) {
			t.Errorf("created %v updated %v, want equal non-zero times", got.CreatedAt, got.UpdatedAt)
		}

		// The same revision again changes nothing, even with other details.
		again := first
		again.Source, again.Manifest = "file:///elsewhere/llama", []byte(`{}`)
		created, err = s.PutRevision(ctx, again)
		if err != nil || created {
			t.Fatalf("second put: created=%v err=%v, want false, nil", created, err)
		}
		got2, err := s.Revision(ctx, "llama", "sha256:aa")
		if err != nil {
			t.Fatal(err)
		}
		if got2.Source != first.Source || string(got2.Manifest) != string(first.Manifest) || !got2.UpdatedAt.Equal(got.UpdatedAt) {
			t.Errorf("second put changed the revision: %+v", got2)
		}
		revs, err := s.Revisions(ctx, "llama")
		if err != nil {
			t.Fatal(err)
		}
		if len(revs) != 1 {
			t.Errorf("%d rows after two puts of one revision, want 1", len(revs))
		}
		// The same digest under another model is another revision.
		if created, err := s.PutRevision(ctx, Revision{Model: "llama-copy", Digest: "sha256:aa"}); err != nil || !created {
			t.Errorf("same digest, other model: created=%v err=%v", created, err)
		}
	})
}

func TestPutRevisionRejectsBadInput(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := bk.open(t)
		tests := []struct {
			name string
			rev  Revision
		}{
			{"no model", Revision{Digest: "sha256:aa"}},
			{"no digest", Revision{Model: "m"}},
			{"manifest not JSON", Revision{Model: "m", Digest: "sha256:aa", Manifest: []byte("{nope")}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if _, err := s.PutRevision(context.Background(), tt.rev); !errors.Is(err, ErrInvalid) {
					t.Errorf("err = %v, want ErrInvalid", err)
				}
			})
		}
		if models, err := s.Models(context.Background()); err != nil || len(models) != 0 {
			t.Errorf("models after rejected puts = %v, %v; want none", models, err)
		}
	})
}

func TestSetRevisionState(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		tests := []struct {
			name    string
			path    []RevisionState // states to move through after creation
			to      RevisionState
			reason  string
			wantErr error
		}{
			{"validating to ready", nil, RevisionReady, "", nil},
			{"validating to failed", nil, RevisionFailed, "shard x is missing", nil},
			{"failed needs a reason", nil, RevisionFailed, "", ErrInvalid},
			{"validating to validating", nil, RevisionValidating, "", ErrIllegalTransition},
			{"ready to failed", []RevisionState{RevisionReady}, RevisionFailed, "late", ErrIllegalTransition},
			{"ready to ready", []RevisionState{RevisionReady}, RevisionReady, "", ErrIllegalTransition},
			{"ready to validating", []RevisionState{RevisionReady}, RevisionValidating, "", ErrIllegalTransition},
			{"failed to ready", []RevisionState{RevisionFailed}, RevisionReady, "", ErrIllegalTransition},
			{"unknown state", nil, RevisionState("gone"), "", ErrInvalid},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ctx := context.Background()
				s := bk.open(t)
				s.now = fakeClock()
				if _, err := s.PutRevision(ctx, Revision{Model: "m", Digest: "sha256:aa"}); err != nil {
					t.Fatal(err)
				}
				for _, st := range tt.path {
					if err := s.SetRevisionState(ctx, "m", "sha256:aa", st, "setup"); err != nil {
						t.Fatal(err)
					}
				}
				before, err := s.Revision(ctx, "m", "sha256:aa")
				if err != nil {
					t.Fatal(err)
				}
				err = s.SetRevisionState(ctx, "m", "sha256:aa", tt.to, tt.reason)
				if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				after, err := s.Revision(ctx, "m", "sha256:aa")
				if err != nil {
					t.Fatal(err)
				}
				if tt.wantErr != nil {
					if after.State != before.State || after.Reason != before.Reason || !after.UpdatedAt.Equal(before.UpdatedAt) {
						t.Errorf("a refused move changed the revision: %+v -> %+v", before, after)
					}
					return
				}
				if after.State != tt.to || after.Reason != tt.reason {
					t.Errorf("state=%s reason=%q, want %s %q", after.State, after.Reason, tt.to, tt.reason)
				}
				if !after.UpdatedAt.After(before.UpdatedAt) || !after.CreatedAt.Equal(before.CreatedAt) {
					t.Errorf("times: created %v→%v updated %v→%v", before.CreatedAt, after.CreatedAt, before.UpdatedAt, after.UpdatedAt)
				}
			})
		}
		t.Run("unknown revision", func(t *testing.T) {
			s := bk.open(t)
			if err := s.SetRevisionState(context.Background(), "m", "sha256:none", RevisionReady, ""); !errors.Is(err, ErrNotFound) {
				t.Errorf("err = %v, want ErrNotFound", err)
			}
		})
	})
}

func TestRevisionQueries(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		s.now = fakeClock()
		steps := []struct {
			model, digest string
			state         RevisionState
		}{
			{"b-model", "sha256:01", RevisionReady},
			{"b-model", "sha256:02", RevisionFailed},
			{"a-model", "sha256:03", RevisionValidating},
			{"b-model", "sha256:04", RevisionReady},
			{"b-model", "sha256:05", RevisionValidating},
		}
		for _, st := range steps {
			if _, err := s.PutRevision(ctx, Revision{Model: st.model, Digest: st.digest}); err != nil {
				t.Fatal(err)
			}
			if st.state != RevisionValidating {
				if err := s.SetRevisionState(ctx, st.model, st.digest, st.state, "because"); err != nil {
					t.Fatal(err)
				}
			}
		}
		models, err := s.Models(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"a-model", "b-model"}; !slices.Equal(models, want) {
			t.Errorf("Models = %v, want %v", models, want)
		}

		revs, err := s.Revisions(ctx, "b-model")
		if err != nil {
			t.Fatal(err)
		}
		var digests []string
		for _, r := range revs {
			digests = append(digests, r.Digest)
		}
		if want := []string{"sha256:05", "sha256:04", "sha256:02", "sha256:01"}; !slices.Equal(digests, want) {
			t.Errorf("Revisions(b-model) = %v, want newest first %v", digests, want)
		}
		if revs[2].State != RevisionFailed || revs[2].Reason != "because" {
			t.Errorf("revision 02: state %s reason %q", revs[2].State, revs[2].Reason)
		}

		latest := []struct {
			model   string
			want    string
			wantErr error
		}{
			{"b-model", "sha256:04", nil},
			{"a-model", "", ErrNotFound},
			{"no-model", "", ErrNotFound},
		}
		for _, tt := range latest {
			r, err := s.LatestReady(ctx, tt.model)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) || r.Digest != tt.want {
				t.Errorf("LatestReady(%s) = %q, %v; want %q, %v", tt.model, r.Digest, err, tt.want, tt.wantErr)
			}
		}
		if _, err := s.Revision(ctx, "b-model", "sha256:03"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Revision of another model's digest: err = %v, want ErrNotFound", err)
		}
		if revs, err := s.Revisions(ctx, "no-model"); err != nil || len(revs) != 0 {
			t.Errorf("Revisions(no-model) = %v, %v; want none", revs, err)
		}
	})
}

// TestConcurrentWriters races two stores on one database (as two
// processes, or two gateway replicas, would) and goroutines within each:
// every revision is recorded once and each transition out of validating
// is won by exactly one caller.
func TestConcurrentWriters(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		stores := []*Store{openAt(t, tg), openAt(t, bk.replica(t, tg))}
		const revisions, workers = 8, 6
		var created, moved atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, revisions*workers)
		for w := range workers {
			s := stores[w%len(stores)]
			wg.Go(func() {
				for i := range revisions {
					digest := fmt.Sprintf("sha256:%02d", i)
					ok, err := s.PutRevision(ctx, Revision{Model: "m", Digest: digest})
					if err != nil {
						errs <- err
						return
					}
					if ok {
						created.Add(1)
					}
					to, reason := RevisionReady, ""
					if w%2 == 1 {
						to, reason = RevisionFailed, fmt.Sprintf("worker %d", w)
					}
					err = s.SetRevisionState(ctx, "m", digest, to, reason)
					switch {
					case err == nil:
						moved.Add(1)
					case !errors.Is(err, ErrIllegalTransition):
						errs <- err
						return
					}
					if _, err := s.Revisions(ctx, "m"); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if created.Load() != revisions || moved.Load() != revisions {
			t.Errorf("created %d and moved %d revisions, want %d of each", created.Load(), moved.Load(), revisions)
		}
		revs, err := stores[0].Revisions(ctx, "m")
		if err != nil {
			t.Fatal(err)
		}
		if len(revs) != revisions {
			t.Errorf("%d rows, want %d", len(revs), revisions)
		}
		for _, r := range revs {
			if !r.State.Final() {
				t.Errorf("revision %s left %s", r.Digest, r.State)
			}
		}
	})
}

func TestReadyAdapters(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		put := func(model, digest string, state RevisionState) {
			t.Helper()
			if _, err := s.PutRevision(ctx, Revision{Model: model, Digest: digest, Source: "s3://b/" + model}); err != nil {
				t.Fatal(err)
			}
			reason := ""
			if state == RevisionFailed {
				reason = "bad"
			}
			if state != RevisionValidating {
				if err := s.SetRevisionState(ctx, model, digest, state, reason); err != nil {
					t.Fatal(err)
				}
			}
		}
		put("llama", "sha256:01", RevisionReady)
		put("llama:sql", "sha256:02", RevisionReady)
		put("llama:sql", "sha256:03", RevisionReady)
		put("llama:sql", "sha256:04", RevisionFailed)
		put("llama:law", "sha256:05", RevisionValidating)
		put("llama:chat", "sha256:06", RevisionReady)
		got, err := s.ReadyAdapters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range got {
			names = append(names, r.Model+"@"+r.Digest)
		}
		if want := []string{"llama:chat@sha256:06", "llama:sql@sha256:03"}; !slices.Equal(names, want) {
			t.Fatalf("ReadyAdapters = %v, want %v", names, want)
		}
	})
}
