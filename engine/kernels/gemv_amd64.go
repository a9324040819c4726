//go:build amd64 && !purego

package kernels

// gemvKernel is the signature of both assembly sets' GEMV kernels: out[r]
// for the 4*quads rows of quads adjacent quads of W rows, ws elements
// apart, prefetching pf bytes ahead (into L2 only when far is set).
type gemvKernel[T any] func(x *float32, w *T, ws, k, quads int, out *float32, pf int, far bool)

// stridedRowBytes is the least row length, in bytes, for which F32 and
// BF16 products of one or two x rows take W's rows in quads of rows
// spread apart (see gemvRows).
const stridedRowBytes = 512

// strided reports whether q quads of W rows of k weights of size bytes
// are taken rows q apart (see gemvRows): the runs that makes are too
// short to gain under stridedQuads quads.
func strided(size, k, q int) bool {
	return size > 1 && k*size >= stridedRowBytes && q >= stridedQuads
}

// stridedQuads is the fewest quads that strided spreads.
const stridedQuads = 16

// gemvRows stores the products of x with the rows of W (ws elements of
// size bytes apart, k columns, rows ≥ 1) into out[:rows] through kern. Rows past the
// last quad run as quads of one row (ws = 0), so they are summed as the
// quads' rows are.
//
// Adjacent quads read four runs of one row each, a few KiB at the decode
// shapes, and the hardware prefetchers reach only about two thirds of a
// core's bandwidth on runs that short, even with the kernels' software
// prefetch. So for F32 and BF16, whose decoding costs little beside the
// loads, quad i is rows i, i+q, i+2q and i+3q instead: each of its rows
// goes on into the row below it in the next quad, which makes four long
// sequential runs (BenchmarkDecodeStream on one Zen 5 core: BF16 32000x768
// 23 to 32-33 GB/s, F32 2048x768 22 to 29-34). Every output is summed as
// it is in adjacent quads, since a quad's rows do not share accumulators.
// The kernels for two x rows take their quads the same way; with three or
// four (and the chunks of W that more take) it measured slower. FP8
// keeps adjacent quads and the software prefetch: with its decoding in
// the loop, rows q apart streamed 11-14 GB/s against 18-21.
func gemvRows[T any](kern gemvKernel[T], x []float32, w []T, ws, k, rows int, out []float32, size int) {
	_, _, _ = x[k-1], w[(rows-1)*ws+k-1], out[rows-1]
	q := rows / 4
	switch {
	case q == 0:
	case !strided(size, k, q):
		pf, far := gemvPrefetch(ws, size)
		kern(&x[0], &w[0], ws, k, q, &out[0], pf, far)
	default:
		spreadQuads(q, 1, 0, out, func(i int, sums *[8]float32) {
			kern(&x[0], &w[i*ws], q*ws, k, 1, &sums[0], 0, false)
		})
	}
	for r := 4 * q; r < rows; r++ {
		var one [4]float32
		kern(&x[0], &w[r*ws], 0, k, 1, &one[0], 0, false)
		out[r] = one[0]
	}
}

// spreadQuads runs quad for each quad i < q of W rows i, i+q, i+2q and
// i+3q, which stores the sums for x row t < nx (at most two) and the
// quad's row m in sums[4*t+m], and moves them to out[t*os+i+m*q].
func spreadQuads(q, nx, os int, out []float32, quad func(i int, sums *[8]float32)) {
	var sums [8]float32
	for i := range q {
		quad(i, &sums)
		for t := range nx {
			for m := range 4 {
				out[t*os+i+m*q] = sums[4*t+m]
			}
		}
	}
}
