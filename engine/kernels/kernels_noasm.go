//go:build !amd64 || purego

package kernels

// best is the fastest kernel set this build and CPU support.
var best = &genericKernels

// asmKernels is nil: this build has no assembly kernels.
var asmKernels *kernelSet
