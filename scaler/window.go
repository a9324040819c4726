package scaler

// window integrates a step function (the latest concurrency sample holds
// until the next one) into a ring of fixed-width time buckets, so averages
// over any window up to the ring's span are time-weighted and memory is
// bounded. Times are Unix nanoseconds.
type window struct {
	gran    int64
	buckets []windowBucket

	started bool
	first   int64 // time of the first sample
	last    int64 // time up to which the step function is integrated
	value   float64
}

type windowBucket struct {
	idx      int64   // absolute bucket number; a mismatch means the slot is stale (zero)
	integral float64 // value × seconds accumulated inside the bucket
}

func newWindow(gran int64, span int64) *window {
	n := span/gran + 2
	return &window{gran: gran, buckets: make([]windowBucket, n)}
}

// floorDiv divides rounding towards minus infinity, so times before 1970 map
// to buckets consistently.
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func (w *window) slot(k int64) *windowBucket {
	n := int64(len(w.buckets))
	return &w.buckets[((k%n)+n)%n]
}

// advance integrates the current value up to t. Times earlier than the last
// one are treated as the last one.
func (w *window) advance(t int64) {
	if !w.started || t <= w.last {
		return
	}
	from := w.last
	w.last = t
	if w.value == 0 {
		return // stale slots already read as zero
	}
	n := int64(len(w.buckets))
	kEnd := floorDiv(t, w.gran)
	if kStart := floorDiv(from, w.gran); kEnd-kStart >= n {
		from = (kEnd - n + 1) * w.gran // older buckets fall out of the ring anyway
	}
	for from < t {
		k := floorDiv(from, w.gran)
		end := min((k+1)*w.gran, t)
		b := w.slot(k)
		if b.idx != k {
			*b = windowBucket{idx: k}
		}
		b.integral += w.value * float64(end-from) / 1e9
		from = end
	}
}

// set records a new sample at t: the previous value is integrated up to t
// and v holds from t on.
func (w *window) set(t int64, v float64) {
	if !w.started {
		w.started, w.first, w.last = true, t, t
	}
	w.advance(t)
	w.value = v
}

// average is the time-weighted mean over (now-span, now], counting only time
// since the first sample. Call advance(now) first. The oldest bucket is
// included in proportion to its overlap with the window.
func (w *window) average(now, span int64) float64 {
	if !w.started {
		return 0
	}
	now = max(now, w.last)
	from := max(now-span, w.first)
	if now <= from {
		return 0
	}
	var sum float64
	for k := floorDiv(from, w.gran); k*w.gran < now; k++ {
		b := w.slot(k)
		if b.idx != k || b.integral == 0 {
			continue
		}
		bStart, bEnd := k*w.gran, min((k+1)*w.gran, now)
		covered := bEnd - max(bStart, w.first)
		overlap := bEnd - max(bStart, from)
		if covered <= 0 || overlap <= 0 {
			continue
		}
		sum += b.integral * float64(overlap) / float64(covered)
	}
	return sum / (float64(now-from) / 1e9)
}
