package activator

import (
	"slices"
	"sync"
	"time"
)

// defaultQueueWaitWindow is how long queue-wait samples count when the
// deployment's spec gives no window (config.Default's stable window).
const defaultQueueWaitWindow = 60 * time.Second

// maxQueueWaitSamples bounds one deployment's samples (about 2 MiB): past
// it the oldest go first, so at more than this many requests per window
// the window is the latest maxQueueWaitSamples requests.
const maxQueueWaitSamples = 1 << 16

// queueWaits keeps a deployment's recent queue waits for the scaler's
// queue-wait signal: how long each request waited in the buffer for a
// replica, time-stamped when the wait ended, aging out after the
// deployment's stable window. A request that got a replica at once
// counts as a zero wait; one that gave up at its deadline counts with the
// time it waited.
//
// Only waiting for capacity counts, not waiting for a cold start or for
// capacity that has since grown: a wait is counted from when it began or
// the latest replica was added, whichever is later, and adding a replica
// drops the samples taken before it (they measured a smaller deployment).
// So the waits for a deployment's first replica read zero, and one more
// replica is asked for only while requests keep waiting with the replicas
// now routable.
type queueWaits struct {
	mu      sync.Mutex
	samples []queueWait // oldest first; samples[head:] are live
	head    int
	grew    time.Time // when a replica was last added (zero: never)
}

// queueWait is one request's wait, ended at at.
type queueWait struct {
	at   time.Time
	wait time.Duration
}

// grow records that a replica was added at now.
func (q *queueWaits) grow(now time.Time) {
	q.mu.Lock()
	q.samples, q.head = q.samples[:0], 0
	q.grew = now
	q.mu.Unlock()
}

// add records a wait of waited that ended at now; samples older than
// window are dropped.
func (q *queueWaits) add(now time.Time, waited time.Duration, window time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.grew.IsZero() {
		waited = min(waited, now.Sub(q.grew))
	}
	q.expire(now, window)
	if len(q.samples)-q.head >= maxQueueWaitSamples {
		q.head++
	}
	if q.head > 0 && q.head >= len(q.samples)/2 { // amortised O(1) per sample
		q.samples = append(q.samples[:0], q.samples[q.head:]...)
		q.head = 0
	}
	q.samples = append(q.samples, queueWait{at: now, wait: max(waited, 0)})
}

// p90 is the 90th percentile (nearest rank) of the waits that ended within
// window before now, and whether there was any.
func (q *queueWaits) p90(now time.Time, window time.Duration) (time.Duration, bool) {
	q.mu.Lock()
	q.expire(now, window)
	waits := make([]time.Duration, len(q.samples)-q.head)
	for i, s := range q.samples[q.head:] {
		waits[i] = s.wait
	}
	q.mu.Unlock()
	if len(waits) == 0 {
		return 0, false
	}
	slices.Sort(waits)
	return waits[(9*len(waits)+9)/10-1], true
}

// expire drops the samples that ended window or longer before now.
// Callers hold mu.
func (q *queueWaits) expire(now time.Time, window time.Duration) {
	if window <= 0 {
		window = defaultQueueWaitWindow
	}
	cut := now.Add(-window)
	for q.head < len(q.samples) && !q.samples[q.head].at.After(cut) {
		q.head++
	}
	if q.head == len(q.samples) {
		q.samples, q.head = q.samples[:0], 0
	}
}
