//go:build !cuda

package cuda

// Available reports whether this binary can drive a CUDA device: never
// without -tags cuda.
func Available() bool { return false }
