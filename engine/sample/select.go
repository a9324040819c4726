package sample

import (
	"math"
	"math/bits"
	"slices"
)

// cand is a candidate token with a sort key: its logit while candidates are
// being selected, its unnormalised probability (weight) once drawn from.
type cand struct {
	id  int32
	key float32
}

// better is the total order the sampler ranks by: larger key first, lower
// id first among equal keys.
func better(a, b cand) bool {
	return a.key > b.key || (a.key == b.key && a.id < b.id)
}

func compareCands(a, b cand) int {
	switch {
	case better(a, b):
		return -1
	case better(b, a):
		return 1
	}
	return 0
}

// topK appends to c the k best tokens of logits among those with logit
// above floor, ranked by logit, best first. It runs a k-sized heap whose
// root is the worst kept token; once it is full a token must beat the root,
// so most tokens (and most blocks of eight) cost one comparison each.
func topK(c []cand, logits []float32, k int, floor float32) []cand {
	h := c[:0]
	lim := floor // a token is taken when its logit is above lim
	take := func(i int, l float32) {
		x := cand{id: int32(i), key: l}
		if len(h) < k {
			h = append(h, x)
			// sift up: a worse token moves towards the root
			for j := len(h) - 1; j > 0; {
				p := (j - 1) / 2
				if !better(h[p], h[j]) {
					break
				}
				h[p], h[j] = h[j], h[p]
				j = p
			}
		} else {
			// x comes after every kept id, so beating the root's logit
			// is beating the root.
			h[0] = x
			siftDown(h, 0)
		}
		if len(h) == k && h[0].key > lim {
			lim = h[0].key
		}
	}
	i := 0
	for ; i+8 <= len(logits); i += 8 {
		b := logits[i : i+8 : i+8]
		if !(b[0] > lim || b[1] > lim || b[2] > lim || b[3] > lim ||
			b[4] > lim || b[5] > lim || b[6] > lim || b[7] > lim) {
			continue
		}
		for j, l := range b {
			if l > lim {
				take(i+j, l)
			}
		}
	}
	for ; i < len(logits); i++ {
		if l := logits[i]; l > lim {
			take(i, l)
		}
	}
	// Heap sort: popping the worst to the end leaves the best first.
	for n := len(h) - 1; n > 0; n-- {
		h[0], h[n] = h[n], h[0]
		siftDown(h[:n], 0)
	}
	return h
}

// siftDown restores the worst-at-root heap order below j.
func siftDown(h []cand, j int) {
	for {
		w := j
		if l := 2*j + 1; l < len(h) && better(h[w], h[l]) {
			w = l
		}
		if r := 2*j + 2; r < len(h) && better(h[w], h[r]) {
			w = r
		}
		if w == j {
			return
		}
		h[j], h[w] = h[w], h[j]
		j = w
	}
}

// nucleusSorted returns the shortest prefix of weighted candidates c (best
// first) whose weight reaches target, and that prefix's weight.
func nucleusSorted(c []cand, target float64) ([]cand, float64) {
	cum := 0.0
	for i, x := range c {
		cum += float64(x.key)
		if cum >= target {
			return c[:i+1], cum
		}
	}
	return c, cum
}

// numBuckets bounds the weight buckets of nucleus: weights lie in
// [e^tailLog, 1], about 44 octaves of 64 buckets each.
const numBuckets = 4096

// bucket sorts a weight in (0, 1] into one of numBuckets ranges, 0 for the
// heaviest, by its float32 exponent and top 6 mantissa bits: monotone, and
// the weights in one bucket are within a factor 2^(1/64) of each other.
func bucket(w float32) int {
	d := int32(math.Float32bits(1)) - int32(math.Float32bits(w))
	if d <= 0 {
		return 0
	}
	return min(int(d>>17), numBuckets-1)
}

// sortMax is the most candidates nucleus ranks by sorting them all.
const sortMax = 2048

// nucleus is nucleusSorted for unsorted candidates of total weight z,
// without sorting them all. It reorders c and returns the nucleus as a
// prefix of it (in no particular order) with its weight. hist and scratch
// are reusable buffers (numBuckets long; any length).
//
// First every candidate lighter than (z-target)/len(c) goes: together they
// weigh less than z-target, so the nucleus never reaches them, and with a
// peaked distribution few candidates remain to be sorted. Otherwise a
// histogram of the weights finds the bucket where the cumulative weight
// crosses target, and only that bucket's candidates are ranked.
func nucleus(c []cand, hist []float64, scratch *[]cand, z, target float64) ([]cand, float64) {
	if target >= z || len(c) == 0 {
		return c, z
	}
	e := (z - target) / float64(len(c))
	light := float32(e)
	if float64(light) > e {
		light = math.Nextafter32(light, 0)
	}
	n := 0
	for _, x := range c {
		if x.key >= light {
			c[n] = x
			n++
		}
	}
	c = c[:n]
	if n <= sortMax {
		slices.SortFunc(c, compareCands)
		return nucleusSorted(c, target)
	}
	clear(hist)
	for _, x := range c {
		hist[bucket(x.key)] += float64(x.key)
	}
	cum, edge := 0.0, numBuckets
	for b, w := range hist {
		if cum+w >= target {
			edge = b
			break
		}
		cum += w
	}
	if edge == numBuckets {
		return c, cum
	}
	// Keep the buckets above the edge at the front of c and copy the edge
	// bucket aside (branch-free: which way a candidate goes is close to a
	// coin flip here), then bring the edge bucket back behind the front.
	front, aside := 0, (*scratch)[:0]
	for _, x := range c {
		b := bucket(x.key)
		c[front] = x
		front += b2i(b < edge)
		if b == edge {
			aside = append(aside, x)
		}
	}
	*scratch = aside
	end := front + copy(c[front:], aside)
	mid := c[front:end]
	// Rank the edge bucket a growing prefix at a time.
	for lo, step := 0, 32; lo < len(mid); step *= 2 {
		hi := min(lo+step, len(mid))
		selectTop(mid[lo:], hi-lo)
		slices.SortFunc(mid[lo:hi], compareCands)
		for i := lo; i < hi; i++ {
			cum += float64(mid[i].key)
			if cum >= target {
				return c[:front+i+1], cum
			}
		}
		lo = hi
	}
	return c[:end], cum
}

// selectTop reorders c so that c[:k] hold its k best candidates (in no
// particular order): quickselect with a median-of-three pivot, falling back
// to a full sort if the partitions keep coming out lopsided.
func selectTop(c []cand, k int) {
	lo, hi := 0, len(c)
	if k <= 0 || k >= hi {
		return
	}
	for depth := 2 * bits.Len(uint(hi)); hi-lo > 12; depth-- {
		if depth == 0 {
			slices.SortFunc(c[lo:hi], compareCands)
			return
		}
		p := partition(c[lo:hi]) + lo
		switch {
		case p == k:
			return
		case p < k:
			lo = p + 1
		default:
			hi = p
		}
	}
	// insertion sort of the last short range
	for i := lo + 1; i < hi; i++ {
		for j := i; j > lo && better(c[j], c[j-1]); j-- {
			c[j], c[j-1] = c[j-1], c[j]
		}
	}
}

// partition splits c (len >= 3) around a median-of-three pivot: better
// candidates before it, worse after; it returns the pivot's index.
func partition(c []cand) int {
	last, mid := len(c)-1, len(c)/2
	if better(c[mid], c[0]) {
		c[mid], c[0] = c[0], c[mid]
	}
	if better(c[last], c[0]) {
		c[last], c[0] = c[0], c[last]
	}
	if better(c[last], c[mid]) {
		c[last], c[mid] = c[mid], c[last]
	}
	// c[0] >= c[mid] >= c[last]; the median goes to the end as the pivot.
	c[mid], c[last] = c[last], c[mid]
	pivot := c[last]
	i := 0
	for j := 0; j < last; j++ {
		if better(c[j], pivot) {
			c[i], c[j] = c[j], c[i]
			i++
		}
	}
	c[i], c[last] = c[last], c[i]
	return i
}

const (
	log2e = 1.4426950408889634
	ln2   = 0.6931471805599453
	// roundMagic is 1.5·2^52: adding it to a float64 of magnitude below
	// 2^51 rounds it to an integer held in the low mantissa bits.
	roundMagic = 6755399441055744.0
)

// exp2Frac holds 2^(i/64) for i in [0, 64).
var exp2Frac = func() (t [64]float64) {
	for i := range t {
		t[i] = math.Exp2(float64(i) / 64)
	}
	return t
}()

// expNeg is e^x for x <= 0, with relative error under 1e-10; results below
// 2^-1022 flush to zero, and NaN gives 0.
func expNeg(x float64) float64 {
	if !(x >= -708) {
		return 0
	}
	return expInRange(x)
}

// expInRange is expNeg for x in [-708, 0], small enough to inline: about
// twice as fast as math.Exp in pure Go, which matters over a 128k vocabulary.
func expInRange(x float64) float64 {
	// e^x = 2^(k/64) · e^f with k = round(64·x·log2 e), |f| <= ln2/128,
	// and 2^(k/64) = 2^(k>>6) · exp2Frac[k&63].
	y := x * (64 * log2e)
	t := y + roundMagic
	f := (y - (t - roundMagic)) * (ln2 / 64)
	k := math.Float64bits(t)
	p := 1 + f*(1+f*(1.0/2+f*(1.0/6))) // error f⁴/24 < 4e-11
	return p * exp2Frac[k&63] * math.Float64frombits(((k>>6)+1023)<<52)
}

// b2i is 1 for true; the compiler makes it a flag read, not a branch.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
