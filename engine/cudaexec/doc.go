// Package cudaexec is the GPU forward pass of the Llama family and the
// executor that runs the engine's scheduler steps with it (a
// core.Executor), over weights in CUDA device memory: F32, BF16 and FP8
// E4M3 with block-wise (HF fine-grained), per-row or per-tensor scales.
//
// The kernels are hand-written PTX, generated as text by Module (RMSNorm,
// RoPE, the KV-cache store, paged attention over the block tables,
// SwiGLU, residual adds, dequantising GEMV in scalar and vectorised
// forms, FP8/BF16 dequantisation, a tiled SGEMM) and loaded with
// cu.LoadData; products of more tokens than the GEMV serves go through
// cuBLAS SGEMM (gorgonia.org/cu/blas) over weights expanded to float32 a
// chunk at a time, or, built with -tags nocublas, through the PTX SGEMM.
// Tokens are sampled on the host from the logit rows copied back.
//
// What runs on the host is plain Go, built and tested without the cuda
// tag: the step plan (KV slots, block tables, rotary tables, packed into
// one upload), weight resolution, kernel arguments and launch geometry,
// and an emulation of the kernels checked against the CPU model. The
// device half (Model, Executor, UploadSource) needs -tags cuda.
package cudaexec
