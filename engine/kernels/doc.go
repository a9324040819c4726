// Package kernels holds the CPU compute kernels of the inference engine:
// matrix multiplication against F32, BF16 and FP8 (E4M3FN) weights, and the
// vector helpers that attention and normalisation use.
//
// Decode (one token per sequence) is a matrix-vector product bound by
// memory bandwidth; prefill is a matrix-matrix product bound by arithmetic.
// Both run through [Pool.MatMul], which splits the rows of W across the
// pool's threads in 128-row chunks (so no thread splits an FP8 block).
//
// # Kernel sets
//
// A [Set] is one implementation of the inner loops: "avx512" (AVX-512 F,
// BW, VL, DQ and FMA), "avx2" (AVX2, FMA and F16C) or "generic" (portable
// Go, also what purego builds and other architectures run). [Supported]
// lists what this CPU runs; a pool computes with the set it was made with
// ([Set.NewPool]), and [NewPool] uses [Default]: the set STOKE_KERNELS
// names, else the fastest. Sets agree within float rounding, not bit for
// bit.
//
// # One result per input
//
// Within a set, every output of [Pool.MatMul] and [Pool.MulRows] is summed
// in one order that depends only on the row of x, the row of W and their
// length: never on the batch size, on which kernel (GEMV, small batch,
// tile) or tile shape computed it, on how the rows were split across
// threads, or on how a prompt was chunked. Each output has one
// accumulator, fed the columns in vector-wide blocks from the first
// (16 columns for avx512, 8 for avx2, 1 for generic), then reduced across
// lanes by the set's one tree; avx512 adds the last k%16 columns as a
// masked block, avx2 adds the last k%8 columns one by one after the
// reduction. Rows of W past the last quad are computed as a quad of that
// row repeated, so they are summed as quads are, and columns are never
// split into blocks. BF16 and FP8 weights are widened exactly, so a path
// that widens W into F32 first gives the same bits as one that decodes in
// registers. Continuous batching relies on this: at temperature 0 a
// request gets the same tokens whatever else is in the batch.
// [Pool.AddWeightedRows], [Pool.ExpSum] and [Pool.SiLUMul] keep the same
// promise for their outputs; [Pool.Dot] does not (it may sum in any
// order, for speed).
//
// How the work is laid out:
//
//   - Every kernel computes a tile of dot products along Cols (both x and
//     W are row-major along it): 4 x rows × 4 W rows with 16 vector
//     accumulators, so each W vector loaded serves four x rows and each x
//     vector four W rows, or 1 x row × 4 W rows for single-sequence
//     decode. Columns that do not fill a vector are handled with masked
//     loads (AVX-512) or scalar code (AVX2).
//   - In decode and small batches, BF16 and FP8 weights are decoded in
//     registers as they stream in, never written back to memory; large
//     products widen each quad of W rows into F32 scratch once and run
//     the F32 tiles over it (Set.widenTiles: 7-9% faster FP8 prefill on
//     AVX-512, twice as fast on AVX2). The AVX2 set takes large products
//     (F32 too) in groups of W rows that stay in L2 while each quad of x
//     rows in turn stays in L1 and the group streams past it, widening
//     each row once per product (Set.xStationary): with 512 KiB of L2
//     (Zen 3) a block of x rows does not stay there. BF16 is decoded by
//     widening to 32 bits and shifting left 16. FP8 E4M3FN is decoded
//     exactly, subnormals included, at 1/256 of its value (fp8Unit) by
//     every set and path: the assembly sign-extends each byte to 16 bits,
//     shifts and masks it into the IEEE half of that value and widens
//     that with VCVTPH2PS (16 weights per widening on AVX2), the portable
//     set reads a table, and W widened into F32 is stored at the same
//     1/256, so all take x as it is and give the same products. No
//     decoded weight is a float32 subnormal: putting E4M3's bits into
//     float32's exponent field directly (the value × 2^-120, with no
//     conversion) makes each FP8 subnormal one, and an FMA with a
//     subnormal operand takes a microcode assist on Intel cores (random
//     bytes, 5% of them subnormal, decoded 14 times slower on a Xeon).
//   - FP8 per-tensor and per-row scales multiply the outputs. Block scales
//     (Hugging Face fine-grained FP8, typically 128x128) are folded, for
//     each block of BlockRows output rows, into a scaled copy of x (one
//     scale per column block), so the dot products come out scaled.
//   - Single-token products (n = 1, decode) run through GEMV kernels that
//     loop over all of a thread's 4-row tiles in one assembly call and
//     prefetch the next tile while multiplying the current one: decode rows
//     are too short for the hardware prefetchers to reach full bandwidth,
//     which left FP8 and BF16 decode waiting on memory latency. F32 and
//     BF16 rows of 512 bytes or more, in shares of 64 rows or more, go
//     further, for one or two x rows: each quad takes rows a quarter of
//     the thread's share apart, so its four rows are four long sequential
//     runs that the prefetchers follow (gemvRows); a quad's rows share
//     no accumulator, so this changes no output's bits.
//   - Small batches (2 to 64 tokens, continuous batching's decode steps)
//     run through the same kind of one-call kernels for two or four x rows
//     (three use the four-row kernel with the last row's stores masked),
//     so each W vector is decoded once per four x rows and the next quad
//     is prefetched. W is taken 32 KiB at a time, and each such chunk is
//     multiplied by every group of four x rows while it is in cache. This
//     is 1.5-3x faster than one tile call per 4x4 block without prefetch
//     (BenchmarkBatchStream); from four x rows on, one core is limited by
//     the FMA throughput of the 4x4 tile rather than by memory.
//   - x is processed in blocks that stay in L2 while W streams past, a
//     quad of W rows at a time staying in L1 while every x tile of the
//     block uses it. Columns are not blocked (see above).
//   - Attention reads the paged KV cache in place, one 16-position block
//     at a time: [Pool.MulRows] multiplies a run of queries with the block's
//     keys (the small-batch kernels, at the cache's row stride), and
//     [Pool.AddWeightedRows] adds the block's values weighed by each query's
//     softmax, broadcasting one weight over 64 columns of four query rows
//     per step, so values are neither transposed nor summed across lanes.
//     [Pool.ExpSum] and [Pool.SiLUMul] evaluate exp 16 lanes at a time (a Cephes
//     polynomial scaled by VSCALEFPS; on AVX2, 8 lanes, the exponent
//     added to the bits), for the softmax and for SwiGLU; [Pool.Max]
//     gives the softmax its shift (VMAXPS, whose result no order changes).
//
// The avx2 set has 16 vector registers instead of 32: its tiles are 4x3
// (twelve accumulators, so the FMA units never wait on one), run down a
// whole column of x rows per call, and its small-batch kernels serve
// batches up to 16 tokens, past which widening W once beats decoding it in
// registers: four x rows against two W rows at a time (eight
// accumulators), so each W vector is decoded once per four x rows, read
// from L1 as the FMAs' memory operands; the last two or three rows of a
// batch take two x rows against four W rows.
//
// On the 2-core Zen 4 development machine one core reaches about 90-100
// GFLOP/s on F32 prefill (peak 117), and decode streams weights at close
// to the measured memory bandwidth; see BenchmarkMatMul and
// BenchmarkMemoryBandwidth.
package kernels
