//go:build !amd64 || purego

package kernels

// avx512Kernels and avx2Kernels are nil: this build has no assembly kernels.
var avx512Kernels, avx2Kernels *Set
