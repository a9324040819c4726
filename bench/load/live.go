package load

import (
	"slices"
	"sync"
	"time"
)

// Tally keeps a running count of a load as it goes, for a live display:
// hook Sent to Options.OnSend and Done to Options.OnResult. It is safe for
// concurrent use.
type Tally struct {
	mu     sync.Mutex
	start  time.Time
	sent   int
	done   int
	failed int
	ttfts  []float64 // ms, of the requests that succeeded
}

// NewTally starts a tally at now.
func NewTally(now time.Time) *Tally { return &Tally{start: now} }

// Sent counts a request sent.
func (t *Tally) Sent() {
	t.mu.Lock()
	t.sent++
	t.mu.Unlock()
}

// Done counts a request ended.
func (t *Tally) Done(r Result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done++
	if !r.OK() {
		t.failed++
		return
	}
	t.ttfts = append(t.ttfts, float64(r.TTFT())/float64(time.Millisecond))
}

// LiveStats are a tally's figures at one moment.
type LiveStats struct {
	// Done are the requests ended, Failed those of them that failed,
	// InFlight those sent and not yet ended.
	Done, Failed, InFlight int
	// Elapsed is the time since the tally started; RequestRate Done over
	// it.
	Elapsed     time.Duration
	RequestRate float64
	// TTFTP50 and TTFTP99 are the time to first token's median and 99th
	// percentile so far, in milliseconds (0 before the first success).
	TTFTP50, TTFTP99 float64
}

// Snapshot is the tally at now.
func (t *Tally) Snapshot(now time.Time) LiveStats {
	t.mu.Lock()
	s := LiveStats{Done: t.done, Failed: t.failed, InFlight: t.sent - t.done, Elapsed: now.Sub(t.start)}
	ttfts := slices.Clone(t.ttfts)
	t.mu.Unlock()
	if secs := s.Elapsed.Seconds(); secs > 0 {
		s.RequestRate = float64(s.Done) / secs
	}
	if len(ttfts) > 0 {
		slices.Sort(ttfts)
		s.TTFTP50, s.TTFTP99 = percentile(ttfts, 50), percentile(ttfts, 99)
	}
	return s
}
