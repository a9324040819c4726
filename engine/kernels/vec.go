package kernels

// Dot returns Σ a[i]*b[i] over the first min(len(a), len(b)) elements.
func Dot(a, b []float32) float32 {
	n := min(len(a), len(b))
	if n == 0 {
		return 0
	}
	return best.dot(a[:n], b[:n])
}

// AXPY adds alpha*x[i] to y[i] for the first min(len(y), len(x)) elements.
func AXPY(y []float32, alpha float32, x []float32) {
	n := min(len(y), len(x))
	if n == 0 {
		return
	}
	best.axpy(y[:n], alpha, x[:n])
}

// Scale multiplies every element of y by alpha.
func Scale(y []float32, alpha float32) {
	if len(y) == 0 {
		return
	}
	best.scale(y, alpha)
}
