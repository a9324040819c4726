package activator

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/config"
)

var qwEpoch = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return qwEpoch.Add(d) }

// qwSample is a wait of waited that ended at end after qwEpoch.
type qwSample struct{ end, waited time.Duration }

// TestQueueWaits drives queueWaits with explicit times: the p90 is over
// the waits that ended within the window, waits start no earlier than the
// latest added replica, and an added replica forgets the waits before it.
func TestQueueWaits(t *testing.T) {
	const window = time.Minute
	type sample = qwSample
	for _, tc := range []struct {
		name    string
		grew    []time.Duration // replicas added, after qwEpoch, before the samples
		samples []sample
		grewAt  time.Duration // a replica added after the samples (0: none)
		query   time.Duration
		want    time.Duration
		ok      bool
	}{
		{name: "no samples", query: 0, want: 0, ok: false},
		{name: "one sample", samples: []sample{{0, 2 * time.Second}}, query: time.Second, want: 2 * time.Second, ok: true},
		{name: "still in the window", samples: []sample{{0, 2 * time.Second}}, query: window - time.Nanosecond, want: 2 * time.Second, ok: true},
		{name: "aged out after the window", samples: []sample{{0, 2 * time.Second}}, query: window, want: 0, ok: false},
		{name: "only the old sample ages out",
			samples: []sample{{0, 9 * time.Second}, {30 * time.Second, time.Second}}, query: window + time.Second, want: time.Second, ok: true},
		{name: "p90 of ten is the ninth",
			samples: tenSamples(), query: 10 * time.Second, want: 9 * time.Millisecond, ok: true},
		{name: "zero waits count",
			samples: []sample{{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 5 * time.Second}},
			query:   time.Second, want: 0, ok: true},
		{name: "a wait for a cold start counts from the replica's arrival",
			grew: []time.Duration{30 * time.Second}, samples: []sample{{30*time.Second + 3*time.Millisecond, 30 * time.Second}},
			query: 31 * time.Second, want: 3 * time.Millisecond, ok: true},
		{name: "an added replica forgets the waits before it",
			samples: []sample{{0, 5 * time.Second}}, grewAt: time.Second, query: 2 * time.Second, want: 0, ok: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var q queueWaits
			for _, g := range tc.grew {
				q.grow(at(g))
			}
			for _, s := range tc.samples {
				q.add(at(s.end), s.waited, window)
			}
			if tc.grewAt > 0 {
				q.grow(at(tc.grewAt))
			}
			got, ok := q.p90(at(tc.query), window)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("p90 = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// tenSamples are waits of 10 ms down to 1 ms, one a second.
func tenSamples() (s []qwSample) {
	for i := 1; i <= 10; i++ {
		s = append(s, qwSample{time.Duration(i) * time.Second, time.Duration(11-i) * time.Millisecond})
	}
	return s
}

// TestQueueWaitsBounded checks that the samples stay bounded however many
// requests a window holds, and that the oldest go first.
func TestQueueWaitsBounded(t *testing.T) {
	var q queueWaits
	n := maxQueueWaitSamples + 1000
	for i := range n {
		// The first 1000 waited an hour; all end within the window.
		w := time.Duration(0)
		if i < 1000 {
			w = time.Hour
		}
		q.add(at(time.Duration(i)*time.Microsecond), w, time.Hour)
	}
	if live := len(q.samples) - q.head; live != maxQueueWaitSamples {
		t.Fatalf("%d samples kept, want %d", live, maxQueueWaitSamples)
	}
	if got, _ := q.p90(at(time.Second), time.Hour); got != 0 {
		t.Fatalf("p90 = %v, want 0: the oldest samples should have gone first", got)
	}
}

// TestQueueWaitP90 checks the activator's wiring: requests that found a
// free replica count as zero waits, a request that waited for the
// deployment's first replica counts only from that replica's arrival, and
// one that gave up at its deadline counts what it waited.
func TestQueueWaitP90(t *testing.T) {
	spec := config.Default()
	spec.Buffer.Timeout = config.Duration(10 * time.Second)
	a, ts, res := newTestActivator(t, spec)
	if got := a.QueueWaitP90("m"); got != 0 {
		t.Fatalf("QueueWaitP90 before any request = %v, want 0", got)
	}
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"x","choices":[]}`))
	}))
	defer engine.Close()

	// A cold request: buffered until the first replica is added.
	done := make(chan int, 1)
	go func() {
		resp, _ := post(t, ts.URL, `{"model":"m","prompt":"x"}`)
		done <- resp.StatusCode
	}()
	for res.pokes.Load() == 0 { // it is in the buffer
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a cold start, however short
	added := time.Now()
	a.AddReplica("m", "r1", strings.TrimPrefix(engine.URL, "http://"), 4)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("cold request: status %d", code)
	}
	sinceAdded := time.Since(added)
	if got := a.QueueWaitP90("m"); got > sinceAdded {
		t.Fatalf("QueueWaitP90 = %v after a cold start, want at most the %v since the replica was added", got, sinceAdded)
	}

	// Requests that find room wait zero: the p90 of many is zero.
	for range 20 {
		if resp, body := post(t, ts.URL, `{"model":"m","prompt":"x"}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	if got := a.QueueWaitP90("m"); got != 0 {
		t.Fatalf("QueueWaitP90 = %v with a free replica for every request, want 0", got)
	}

}

// TestQueueWaitP90Deadline checks that a request that gave up at its
// deadline in the buffer counts what it waited.
func TestQueueWaitP90Deadline(t *testing.T) {
	spec := config.Default()
	spec.Buffer.Timeout = config.Duration(20 * time.Millisecond)
	a, ts, _ := newTestActivator(t, spec)
	if resp, _ := post(t, ts.URL, `{"model":"m","prompt":"x"}`); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d with no replica, want 503", resp.StatusCode)
	}
	if got := a.QueueWaitP90("m"); got <= 0 {
		t.Fatalf("QueueWaitP90 = %v after a request timed out in the buffer, want > 0", got)
	}
}
