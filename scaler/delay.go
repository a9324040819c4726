package scaler

// maxHold is a sliding-window maximum over a step function of
// recommendations: each recommendation is in force from its time until the
// next one, and max returns the largest one in force at any time within the
// last delay. A monotonic deque keeps it O(1) amortised; because entries are
// strictly decreasing from front to back, there are never more of them than
// distinct replica counts.
type maxHold struct {
	delay   int64
	entries []holdEntry
}

type holdEntry struct {
	value int
	at    int64 // when it was recommended
	until int64 // when the next recommendation replaced it (valid once !open)
	open  bool  // true while it is the latest recommendation
}

// push records recommendation v at t and returns the held maximum.
func (h *maxHold) push(t int64, v int) int {
	if n := len(h.entries); n > 0 && h.entries[n-1].open {
		h.entries[n-1].open, h.entries[n-1].until = false, t
	}
	for len(h.entries) > 0 && h.entries[len(h.entries)-1].value <= v {
		h.entries = h.entries[:len(h.entries)-1]
	}
	h.entries = append(h.entries, holdEntry{value: v, at: t, open: true})
	cut := t - h.delay
	drop := 0
	for drop < len(h.entries)-1 && h.entries[drop].until <= cut {
		drop++
	}
	if drop > 0 {
		h.entries = append(h.entries[:0], h.entries[drop:]...)
	}
	return h.entries[0].value
}

// front is the entry whose value push last returned.
func (h *maxHold) front() holdEntry { return h.entries[0] }
