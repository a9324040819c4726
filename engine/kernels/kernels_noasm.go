//go:build !amd64 || purego

package kernels

// best is the fastest kernel set this build and CPU support.
var best = &genericKernels

// avx512Kernels and avx2Kernels are nil: this build has no assembly kernels.
var avx512Kernels, avx2Kernels *kernelSet
