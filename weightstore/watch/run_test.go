package watch

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/push"
	"github.com/stokehq/stoke/weightstore/synth"
)

// fileEnv is a file:// bucket holding a pushed tiny checkpoint, and a
// store.
func fileEnv(t *testing.T) (root bucket.Bucket, st *store.Store, revision string) {
	t.Helper()
	dir := t.TempDir()
	m, err := push.Push(context.Background(), writeTiny(t), openBucket(t, "file://"+filepath.Join(dir, "tiny"), bucket.S3Options{}), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err = store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return openBucket(t, "file://"+dir, bucket.S3Options{}), st, m.Revision
}

// TestRun polls with the real clock until the pushed revision is ready,
// while other goroutines call Scan, then stops with its context.
func TestRun(t *testing.T) {
	root, st, revision := fileEnv(t)
	ready := make(chan store.Revision, 1)
	w := New(root, st, Options{Interval: 5 * time.Millisecond, OnRevision: func(r store.Revision) { ready <- r }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 5 {
				if err := w.Scan(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("concurrent Scan: %v", err)
				}
			}
		})
	}
	select {
	case r := <-ready:
		if r.Digest != revision || r.State != store.RevisionReady {
			t.Errorf("event %+v, want %s ready", r, revision)
		}
	case <-time.After(time.Minute):
		t.Fatal("no revision event within a minute")
	}
	wg.Wait()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	if len(ready) != 0 {
		t.Errorf("more than one event for one revision")
	}
}

// TestScanFailures: failures to read or list are returned and retried on
// the next pass; they never mark a revision failed.
func TestScanFailures(t *testing.T) {
	tests := []struct {
		name  string
		fault func(*faultyBucket)
	}{
		{"list fails", func(f *faultyBucket) { f.failList.Store(true) }},
		// One shard at a time, reads go: manifest, config, index, then two
		// per shard header.
		{"manifest read fails", func(f *faultyBucket) { f.failRead.Store(1) }},
		{"config read fails", func(f *faultyBucket) { f.failRead.Store(2) }},
		{"header length read fails", func(f *faultyBucket) { f.failRead.Store(4) }},
		{"header read fails", func(f *faultyBucket) { f.failRead.Store(7) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, st, revision := fileEnv(t)
			faulty := &faultyBucket{Bucket: root}
			var events []store.Revision
			w := New(faulty, st, Options{Parallel: 1, OnRevision: func(r store.Revision) { events = append(events, r) }})
			ctx := context.Background()

			tt.fault(faulty)
			if err := w.Scan(ctx); !errors.Is(err, errInjected) {
				t.Fatalf("Scan with a fault: err = %v, want the injected fault", err)
			}
			if r, err := st.Revision(ctx, "tiny", revision); err == nil && r.State != store.RevisionValidating {
				t.Fatalf("after a failed pass the revision is %s (%s)", r.State, r.Reason)
			}
			if len(events) != 0 {
				t.Fatalf("events after a failed pass: %+v", events)
			}

			faulty.failList.Store(false)
			faulty.failRead.Store(0)
			if err := w.Scan(ctx); err != nil {
				t.Fatalf("Scan after the fault: %v", err)
			}
			r, err := st.Revision(ctx, "tiny", revision)
			if err != nil || r.State != store.RevisionReady {
				t.Fatalf("after recovery: %+v, %v; want ready", r, err)
			}
			if len(events) != 1 {
				t.Errorf("events = %+v, want 1", events)
			}
		})
	}
}

// TestResumeValidating: a revision left validating (a watcher stopped
// mid-check) is checked and settled by the next watcher.
func TestResumeValidating(t *testing.T) {
	root, st, revision := fileEnv(t)
	ctx := context.Background()
	if _, err := st.PutRevision(ctx, store.Revision{Model: "tiny", Digest: revision}); err != nil {
		t.Fatal(err)
	}
	var events []store.Revision
	w := New(root, st, Options{OnRevision: func(r store.Revision) { events = append(events, r) }})
	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].State != store.RevisionReady || events[0].Digest != revision {
		t.Fatalf("events = %+v, want %s ready", events, revision)
	}
	// A second watcher (a restart) over the same store records nothing new.
	w2 := New(root, st, Options{OnRevision: func(r store.Revision) { events = append(events, r) }})
	if err := w2.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 {
		t.Errorf("a restarted watcher reported %d events, want none more", len(events)-1)
	}
}

// TestDTypes: single-file checkpoints of each weight dtype pass the checks,
// and a plain upload's manifest records the dtype push records.
func TestDTypes(t *testing.T) {
	for _, dt := range []dtype.DType{dtype.F32, dtype.BF16, dtype.F8E4M3} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx := context.Background()
			src := filepath.Join(t.TempDir(), "src")
			if err := synth.Write(ctx, src, synth.Options{Preset: "tiny", DType: dt, Seed: 3}); err != nil {
				t.Fatal(err)
			}
			e := newFileEnv(t)
			pushed, err := push.Push(ctx, src, e.openPrefix(t, "pushed"), push.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if pushed.DType != dt.String() {
				t.Fatalf("push recorded dtype %s, want %s", pushed.DType, dt)
			}
			e.uploadDir(t, "plain", src)
			e.scan(t)
			e.clock.Advance(testQuiet)
			e.scan(t)
			checkOne(t, e, "pushed", pushed.Revision, store.RevisionReady)
			r := checkOne(t, e, "plain", pushed.Revision, store.RevisionReady)
			m, err := manifest.Parse(r.Manifest)
			if err != nil {
				t.Fatal(err)
			}
			if m.DType != pushed.DType {
				t.Errorf("plain upload's dtype %s, push's %s", m.DType, pushed.DType)
			}
		})
	}
}
