package cudaexec

import "log/slog"

// Options tune a GPU model.
type Options struct {
	// GEMVMaxTokens is the most tokens a matrix product runs through the
	// dequantising GEMV kernels (weights read once per GEMVTokens tokens,
	// straight from their FP8/BF16 bytes); larger products expand the
	// weights into float32 a chunk of rows at a time and run SGEMM.
	// Default 64.
	GEMVMaxTokens int
	// ScalarGEMV keeps matrix products off the vectorised GEMV kernels
	// (one weight per lane and load instead of four), as a baseline.
	ScalarGEMV bool
	// Logger receives the model's setup; nil means slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.GEMVMaxTokens <= 0 {
		o.GEMVMaxTokens = 64
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}
