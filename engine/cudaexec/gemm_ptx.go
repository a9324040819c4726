//go:build cuda && nocublas

package cudaexec

// newSGEMM returns the PTX SGEMM: binaries built with -tags nocublas do
// not link libcublas (for machines whose CUDA libraries differ from the
// build's; the driver alone runs them).
func newSGEMM(m *Model) (sgemmer, error) { return ptxSGEMM{m}, nil }
