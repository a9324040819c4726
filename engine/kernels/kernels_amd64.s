//go:build amd64 && !purego

#include "textflag.h"

// AVX-512 kernels. Vectors are 16 float32 in a zmm register. Every loop
// runs over whole vectors, then handles the last k%16 columns with masked
// loads (K1), which neither fault nor read past the slices.
//
// BF16 -> F32: zero-extend each u16 to u32 and shift left 16.
// FP8 E4M3FN -> F32 (FP8): sign-extend each byte to 16 bits, shift left 7
// and keep the bits 0xBF80. That is the IEEE half whose value is fp8/256
// exactly (sign in bit 15, the 4 exponent and 3 mantissa bits under a bias
// of 15 instead of 7, subnormals included), which VCVTPH2PS widens to a
// normal float32 (the package doc says why no decoded weight may be a
// float32 subnormal). The NaN codes 0x7F/0xFF decode as ±480.
//
// Every kernel that produces a row's dot product (the 4x4, 1x4, GEMV and
// GEMM kernels) sums it in the same order: one accumulator per output,
// 16-column blocks in sequence, the masked tail last, then REDUCE4. So a
// sequence's results do not depend on how many others share its batch.

// TAILMASK sets K1 to the low CX bits (1 <= CX <= 15). Clobbers AX.
#define TAILMASK \
	MOVL  $1, AX; \
	SHLL  CX, AX; \
	DECL  AX; \
	KMOVW AX, K1

// REDUCE4 sums each of the zmm accumulators za..zd across its 16 lanes and
// leaves the four sums in lanes 0..3 of xa (the low part of za). ya..yd
// name the same registers as za..zd. Clobbers Y16-Y19.
#define REDUCE4(za, zb, zc, zd, ya, yb, yc, yd, xa) \
	VEXTRACTF64X4 $1, za, Y16; \
	VEXTRACTF64X4 $1, zb, Y17; \
	VEXTRACTF64X4 $1, zc, Y18; \
	VEXTRACTF64X4 $1, zd, Y19; \
	VADDPS        Y16, ya, ya; \
	VADDPS        Y17, yb, yb; \
	VADDPS        Y18, yc, yc; \
	VADDPS        Y19, yd, yd; \
	VHADDPS       yb, ya, ya; \
	VHADDPS       yd, yc, yc; \
	VHADDPS       yc, ya, ya; \
	VEXTRACTF32X4 $1, ya, X16; \
	VADDPS        X16, xa, xa

// REDUCE1 sums the 16 lanes of Z0 into lane 0 of X0. Clobbers Y1.
#define REDUCE1 \
	VEXTRACTF64X4 $1, Z0, Y1; \
	VADDPS        Y1, Y0, Y0; \
	VEXTRACTF128  $1, Y0, X1; \
	VADDPS        X1, X0, X0; \
	VHADDPS       X0, X0, X0; \
	VHADDPS       X0, X0, X0

// BF16 loads 16 bf16 weights from mem and widens them into zmm z.
#define BF16(mem, z) \
	VPMOVZXWD mem, z; \
	VPSLLD    $16, z, z

// FP8 loads 16 fp8 weights from mem (or an xmm register) and decodes them
// at 1/256 of their value into zmm z through the half in ymm y (the low
// part of z): each byte sign-extended to a word, shifted left 7 and masked
// with 0xBF80 (in every word of Y31, FP8MASK) is the IEEE half of that
// value.
#define FP8(mem, y, z) \
	VPMOVSXBW mem, y; \
	VPSLLW    $7, y, y; \
	VPANDD    Y31, y, y; \
	VCVTPH2PS y, z

// FP8MASK puts FP8's mask in every word of Y31. Clobbers AX.
#define FP8MASK \
	MOVL         $0xBF80, AX; \
	VPBROADCASTW AX, Y31

#define ZERO16 \
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3; \
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7; \
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11; \
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15

// F44FMA multiplies x rows Z16-Z19 by W rows Z20-Z23 into the 16
// accumulators: Z(4t+r) += x_t * w_r.
#define F44FMA \
	VFMADD231PS Z20, Z16, Z0; VFMADD231PS Z20, Z17, Z4; VFMADD231PS Z20, Z18, Z8; VFMADD231PS Z20, Z19, Z12; \
	VFMADD231PS Z21, Z16, Z1; VFMADD231PS Z21, Z17, Z5; VFMADD231PS Z21, Z18, Z9; VFMADD231PS Z21, Z19, Z13; \
	VFMADD231PS Z22, Z16, Z2; VFMADD231PS Z22, Z17, Z6; VFMADD231PS Z22, Z18, Z10; VFMADD231PS Z22, Z19, Z14; \
	VFMADD231PS Z23, Z16, Z3; VFMADD231PS Z23, Z17, Z7; VFMADD231PS Z23, Z18, Z11; VFMADD231PS Z23, Z19, Z15

// STORE4x4 reduces the 16 accumulators and stores row t's four sums at
// DI + t*DX. Clobbers Y16-Y19.
#define STORE4x4 \
	REDUCE4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0); \
	VMOVUPS X0, (DI); \
	ADDQ    DX, DI; \
	REDUCE4(Z4, Z5, Z6, Z7, Y4, Y5, Y6, Y7, X4); \
	VMOVUPS X4, (DI); \
	ADDQ    DX, DI; \
	REDUCE4(Z8, Z9, Z10, Z11, Y8, Y9, Y10, Y11, X8); \
	VMOVUPS X8, (DI); \
	ADDQ    DX, DI; \
	REDUCE4(Z12, Z13, Z14, Z15, Y12, Y13, Y14, Y15, X12); \
	VMOVUPS X12, (DI)

// LOADX4 loads 16 columns of the four x rows SI, R9, R10, R11 at column
// BX into Z16-Z19.
#define LOADX4 \
	VMOVUPS (SI)(BX*4), Z16; \
	VMOVUPS (R9)(BX*4), Z17; \
	VMOVUPS (R10)(BX*4), Z18; \
	VMOVUPS (R11)(BX*4), Z19

// LOADX4TAIL is LOADX4 for the last columns, masked by K1.
#define LOADX4TAIL \
	VMOVUPS.Z (SI)(BX*4), K1, Z16; \
	VMOVUPS.Z (R9)(BX*4), K1, Z17; \
	VMOVUPS.Z (R10)(BX*4), K1, Z18; \
	VMOVUPS.Z (R11)(BX*4), K1, Z19

// ROWS4 sets up four x row pointers (SI, R9, R10, R11; stride xs floats)
// and four w row pointers (DI, R12, R13, R8; stride ws elements of wsize
// bytes), and CX = k, for the 4x4 kernels. Clobbers BX, DX.
#define ROWS4(wshift) \
	MOVQ x+0(FP), SI; \
	MOVQ xs+8(FP), BX; \
	MOVQ w+16(FP), DI; \
	MOVQ ws+24(FP), DX; \
	MOVQ k+32(FP), CX; \
	SHLQ $2, BX; \
	SHLQ $wshift, DX; \
	LEAQ (SI)(BX*1), R9; \
	LEAQ (SI)(BX*2), R10; \
	LEAQ (R9)(BX*2), R11; \
	LEAQ (DI)(DX*1), R12; \
	LEAQ (DI)(DX*2), R13; \
	LEAQ (R12)(DX*2), R8

// The GEMV kernels below compute single-token (decode) products over many
// rows in one call: an outer loop over quads of W rows, each quad like the
// 1x4 kernels above. Decode streams W from memory in short rows, which the
// hardware prefetchers follow poorly, so while a quad is multiplied the
// kernels prefetch W from pf bytes ahead of it, as much per iteration as the
// quad consumes: the prefetches sweep [quad+pf, quad+pf+4*ws) as the quad
// sweeps [quad, quad+4*ws). pf is one quad; when far is set (for quads
// too large to sit in L1 beside x) the prefetches fill only L2.

// GEMVSETUP loads the common arguments: SI = x, DI = w, DX = ws in bytes
// (wshift = log2 of the weight size), CX = k, R8 = quads, R14 = out,
// AX = k&^31, R13 = k&^15, K1 = the mask of the last k%16 columns.
#define GEMVSETUP(wshift) \
	MOVQ x+0(FP), SI; \
	MOVQ w+8(FP), DI; \
	MOVQ ws+16(FP), DX; \
	SHLQ $wshift, DX; \
	MOVQ k+24(FP), BX; \
	MOVQ quads+32(FP), R8; \
	MOVQ out+40(FP), R14; \
	MOVQ BX, CX; \
	ANDQ $15, CX; \
	TAILMASK; \
	MOVQ BX, CX; \
	MOVQ BX, AX; \
	ANDQ $-32, AX; \
	MOVQ BX, R13; \
	ANDQ $-16, R13

// GEMVQUAD sets up the quad at DI: row pointers DI, R9, R10, R11, the
// prefetch pointer R12, zero accumulators Z0-Z3 and BX = 0.
#define GEMVQUAD \
	LEAQ   (DI)(DX*1), R9; \
	LEAQ   (DI)(DX*2), R10; \
	LEAQ   (R9)(DX*2), R11; \
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3; \
	XORQ   BX, BX

// GEMVSTORE reduces the accumulators, stores the quad's four sums at R14
// and moves on to the next quad; it jumps to loop while quads remain.
#define GEMVSTORE(loop) \
	REDUCE4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0); \
	VMOVUPS X0, (R14); \
	ADDQ    $16, R14; \
	LEAQ    (DI)(DX*4), DI; \
	DECQ    R8; \
	JNZ     loop

// The GEMM kernels below are the GEMV kernels for small batches: one call
// multiplies two (Gemm2) or four (Gemm4) x rows by many quads of W rows,
// decoding each W vector once for all of them, and prefetches the next
// quad (pf = one quad, as for GEMV; into L2 only when far is set) while
// multiplying the current one. Gemm4 also serves three x rows: the caller
// repeats the third row pointer and nx = 3 masks off the fourth row's
// stores (K2). Accumulators Z(4t+r) hold x row t times W row r.
//
// Registers: x rows SI, R9 (, R10, R11); W rows DI, R12, R13, R8 of DX
// bytes; the prefetch pointer R14; BX the column; AX = k&^15; CX = os in
// bytes; K1 the mask of the last k%16 columns. The quad count and the out
// pointer live in the argument slots.

// GEMMSETUP(wshift, k, os) loads W, the strides, K1 and AX; the x rows
// are loaded by the caller.
#define GEMMSETUP(wshift, k, os) \
	MOVQ w+32(FP), DI; \
	MOVQ ws+40(FP), DX; \
	SHLQ $wshift, DX; \
	MOVQ k, CX; \
	ANDQ $15, CX; \
	TAILMASK; \
	MOVQ k, AX; \
	ANDQ $-16, AX; \
	MOVQ os, CX; \
	SHLQ $2, CX

// GEMMQUAD sets up the W row pointers of the quad at DI, the prefetch
// pointer R14 (the next quad) and BX = 0.
#define GEMMQUAD \
	LEAQ (DI)(DX*1), R12; \
	LEAQ (DI)(DX*2), R13; \
	LEAQ (R12)(DX*2), R8; \
	LEAQ (R8)(DX*1), R14; \
	XORQ BX, BX

// F24FMA multiplies x rows Z16, Z17 by W rows Z20-Z23 into Z0-Z7.
#define F24FMA \
	VFMADD231PS Z20, Z16, Z0; VFMADD231PS Z20, Z17, Z4; \
	VFMADD231PS Z21, Z16, Z1; VFMADD231PS Z21, Z17, Z5; \
	VFMADD231PS Z22, Z16, Z2; VFMADD231PS Z22, Z17, Z6; \
	VFMADD231PS Z23, Z16, Z3; VFMADD231PS Z23, Z17, Z7

#define ZERO8 \
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3; \
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7

// Prefetch steps: each 16-column step of a quad consumes 64 bytes of W
// per weight byte, and prefetches as much of the next quad.
#define PF1(PF) PF (R14)(BX*4)
#define PF2(PF) PF (R14)(BX*8); PF 64(R14)(BX*8)
#define PF4(PF) PF (R14); PF 64(R14); PF 128(R14); PF 192(R14); ADDQ $256, R14

// W4F32, W4BF16 and W4FP8 load 16 columns (at BX) of the quad's four W
// rows, widened to F32, into Z20-Z23.
#define W4F32 \
	VMOVUPS (DI)(BX*4), Z20; VMOVUPS (R12)(BX*4), Z21; VMOVUPS (R13)(BX*4), Z22; VMOVUPS (R8)(BX*4), Z23
#define W4BF16 \
	BF16((DI)(BX*2), Z20); BF16((R12)(BX*2), Z21); BF16((R13)(BX*2), Z22); BF16((R8)(BX*2), Z23)
#define W4FP8 \
	FP8((DI)(BX*1), Y20, Z20); FP8((R12)(BX*1), Y21, Z21); FP8((R13)(BX*1), Y22, Z22); FP8((R8)(BX*1), Y23, Z23)

// Masked loads of the last k%16 columns of the W rows.
#define W4F32TAIL \
	VMOVUPS.Z (DI)(BX*4), K1, Z20; VMOVUPS.Z (R12)(BX*4), K1, Z21; \
	VMOVUPS.Z (R13)(BX*4), K1, Z22; VMOVUPS.Z (R8)(BX*4), K1, Z23
#define W4BF16TAIL \
	VMOVDQU16.Z (DI)(BX*2), K1, Y20; VMOVDQU16.Z (R12)(BX*2), K1, Y21; \
	VMOVDQU16.Z (R13)(BX*2), K1, Y22; VMOVDQU16.Z (R8)(BX*2), K1, Y23; \
	BF16(Y20, Z20); BF16(Y21, Z21); BF16(Y22, Z22); BF16(Y23, Z23)
#define W4FP8TAIL \
	VMOVDQU8.Z (DI)(BX*1), K1, X20; VMOVDQU8.Z (R12)(BX*1), K1, X21; \
	VMOVDQU8.Z (R13)(BX*1), K1, X22; VMOVDQU8.Z (R8)(BX*1), K1, X23; \
	FP8(X20, Y20, Z20); FP8(X21, Y21, Z21); FP8(X22, Y22, Z22); FP8(X23, Y23, Z23)

// LOADX2 / LOADX2TAIL load 16 columns of x rows SI, R9 into Z16, Z17.
#define LOADX2 \
	VMOVUPS (SI)(BX*4), Z16; \
	VMOVUPS (R9)(BX*4), Z17
#define LOADX2TAIL \
	VMOVUPS.Z (SI)(BX*4), K1, Z16; \
	VMOVUPS.Z (R9)(BX*4), K1, Z17

// GEMM4(name, wshift, PFSTEP, W4, W4TAIL) is the body of a Gemm4 kernel.
// func name(x0, x1, x2, x3 *float32, w *T, ws, k, quads int, out *float32, os, nx int, far bool)
#define GEMM4(wshift, PFSTEP, W4, W4TAIL, quad, loop0, loop1, tail, store) \
	MOVQ x0+0(FP), SI; \
	MOVQ x1+8(FP), R9; \
	MOVQ x2+16(FP), R10; \
	MOVQ x3+24(FP), R11; \
	GEMMSETUP(wshift, k+48(FP), os+72(FP)); \
	MOVQ nx+80(FP), BX; \
	SUBQ $3, BX; \
	NEGQ BX; \
	ANDQ $15, BX; \
	KMOVW BX, K2; \
quad: \
	GEMMQUAD; \
	ZERO16; \
	TESTQ AX, AX; \
	JZ    tail; \
	CMPB  far+88(FP), $0; \
	JNE   loop1; \
loop0: \
	PFSTEP(PREFETCHT0); \
	LOADX4; \
	W4; \
	F44FMA; \
	ADDQ $16, BX; \
	CMPQ BX, AX; \
	JB   loop0; \
	JMP  tail; \
loop1: \
	PFSTEP(PREFETCHT1); \
	LOADX4; \
	W4; \
	F44FMA; \
	ADDQ $16, BX; \
	CMPQ BX, AX; \
	JB   loop1; \
tail: \
	CMPQ BX, k+48(FP); \
	JAE  store; \
	LOADX4TAIL; \
	W4TAIL; \
	F44FMA; \
store: \
	MOVQ    out+64(FP), BX; \
	REDUCE4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0); \
	VMOVUPS X0, (BX); \
	REDUCE4(Z4, Z5, Z6, Z7, Y4, Y5, Y6, Y7, X4); \
	VMOVUPS X4, (BX)(CX*1); \
	REDUCE4(Z8, Z9, Z10, Z11, Y8, Y9, Y10, Y11, X8); \
	VMOVUPS X8, (BX)(CX*2); \
	REDUCE4(Z12, Z13, Z14, Z15, Y12, Y13, Y14, Y15, X12); \
	LEAQ    (BX)(CX*2), BX; \
	VMOVUPS X12, K2, (BX)(CX*1); \
	ADDQ    $16, out+64(FP); \
	LEAQ    (DI)(DX*4), DI; \
	DECQ    quads+56(FP); \
	JNZ     quad; \
	VZEROUPPER; \
	RET

// GEMM2 is the body of a Gemm2 kernel.
// func name(x0, x1 *float32, _ int, _ int, w *T, ws, k, quads int, out *float32, os int, _ int, far bool)
#define GEMM2(wshift, PFSTEP, W4, W4TAIL, quad, loop0, loop1, tail, store) \
	MOVQ x0+0(FP), SI; \
	MOVQ x1+8(FP), R9; \
	GEMMSETUP(wshift, k+48(FP), os+72(FP)); \
quad: \
	GEMMQUAD; \
	ZERO8; \
	TESTQ AX, AX; \
	JZ    tail; \
	CMPB  far+88(FP), $0; \
	JNE   loop1; \
loop0: \
	PFSTEP(PREFETCHT0); \
	LOADX2; \
	W4; \
	F24FMA; \
	ADDQ $16, BX; \
	CMPQ BX, AX; \
	JB   loop0; \
	JMP  tail; \
loop1: \
	PFSTEP(PREFETCHT1); \
	LOADX2; \
	W4; \
	F24FMA; \
	ADDQ $16, BX; \
	CMPQ BX, AX; \
	JB   loop1; \
tail: \
	CMPQ BX, k+48(FP); \
	JAE  store; \
	LOADX2TAIL; \
	W4TAIL; \
	F24FMA; \
store: \
	MOVQ    out+64(FP), BX; \
	REDUCE4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0); \
	VMOVUPS X0, (BX); \
	REDUCE4(Z4, Z5, Z6, Z7, Y4, Y5, Y6, Y7, X4); \
	VMOVUPS X4, (BX)(CX*1); \
	ADDQ    $16, out+64(FP); \
	LEAQ    (DI)(DX*4), DI; \
	DECQ    quads+56(FP); \
	JNZ     quad; \
	VZEROUPPER; \
	RET

// func f32Dot4x4AVX512(x *float32, xs int, w *float32, ws int, k int, out *float32, os int)
// out[t*os+r] = Σ_j x[t*xs+j] * w[r*ws+j] for t, r < 4.
TEXT ·f32Dot4x4AVX512(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ xs+8(FP), BX
	MOVQ w+16(FP), DI
	MOVQ ws+24(FP), DX
	MOVQ k+32(FP), CX
	SHLQ $2, BX
	SHLQ $2, DX
	LEAQ (SI)(BX*1), R9   // x rows: SI, R9, R10, R11
	LEAQ (SI)(BX*2), R10
	LEAQ (R9)(BX*2), R11
	LEAQ (DI)(DX*1), R12  // w rows: DI, R12, R13, R8
	LEAQ (DI)(DX*2), R13
	LEAQ (R12)(DX*2), R8
	ZERO16
	XORQ BX, BX           // byte offset into every row
	MOVQ CX, AX
	ANDQ $-16, AX
	SHLQ $2, AX           // bytes of whole vectors
	JZ   f44tail

f44loop:
	VMOVUPS (SI)(BX*1), Z16
	VMOVUPS (R9)(BX*1), Z17
	VMOVUPS (R10)(BX*1), Z18
	VMOVUPS (R11)(BX*1), Z19
	VMOVUPS (DI)(BX*1), Z20
	VMOVUPS (R12)(BX*1), Z21
	VMOVUPS (R13)(BX*1), Z22
	VMOVUPS (R8)(BX*1), Z23
	F44FMA
	ADDQ    $64, BX
	CMPQ    BX, AX
	JB      f44loop

f44tail:
	ANDQ $15, CX
	JZ   f44reduce
	TAILMASK
	VMOVUPS.Z (SI)(BX*1), K1, Z16
	VMOVUPS.Z (R9)(BX*1), K1, Z17
	VMOVUPS.Z (R10)(BX*1), K1, Z18
	VMOVUPS.Z (R11)(BX*1), K1, Z19
	VMOVUPS.Z (DI)(BX*1), K1, Z20
	VMOVUPS.Z (R12)(BX*1), K1, Z21
	VMOVUPS.Z (R13)(BX*1), K1, Z22
	VMOVUPS.Z (R8)(BX*1), K1, Z23
	F44FMA

f44reduce:
	MOVQ out+40(FP), DI
	MOVQ os+48(FP), DX
	SHLQ $2, DX
	REDUCE4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0)
	VMOVUPS X0, (DI)
	ADDQ    DX, DI
	REDUCE4(Z4, Z5, Z6, Z7, Y4, Y5, Y6, Y7, X4)
	VMOVUPS X4, (DI)
	ADDQ    DX, DI
	REDUCE4(Z8, Z9, Z10, Z11, Y8, Y9, Y10, Y11, X8)
	VMOVUPS X8, (DI)
	ADDQ    DX, DI
	REDUCE4(Z12, Z13, Z14, Z15, Y12, Y13, Y14, Y15, X12)
	VMOVUPS X12, (DI)
	VZEROUPPER
	RET

// func f32Dot1x4AVX512(x *float32, w *float32, ws int, k int, out *float32)
// out[r] = Σ_j x[j] * w[r*ws+j] for r < 4, 32 columns per iteration.
TEXT ·f32Dot1x4AVX512(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ ws+16(FP), DX
	MOVQ k+24(FP), CX
	SHLQ $2, DX
	LEAQ (DI)(DX*1), R9   // w rows: DI, R9, R10, R11
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7
	XORQ BX, BX           // column index
	MOVQ CX, AX
	ANDQ $-32, AX
	JZ   f14one

f14loop:
	VMOVUPS     (SI)(BX*4), Z16
	VMOVUPS     64(SI)(BX*4), Z17
	VFMADD231PS (DI)(BX*4), Z16, Z0
	VFMADD231PS (R9)(BX*4), Z16, Z1
	VFMADD231PS (R10)(BX*4), Z16, Z2
	VFMADD231PS (R11)(BX*4), Z16, Z3
	VFMADD231PS 64(DI)(BX*4), Z17, Z0
	VFMADD231PS 64(R9)(BX*4), Z17, Z1
	VFMADD231PS 64(R10)(BX*4), Z17, Z2
	VFMADD231PS 64(R11)(BX*4), Z17, Z3
	ADDQ        $32, BX
	CMPQ        BX, AX
	JB          f14loop

f14one:
	MOVQ CX, AX
	ANDQ $-16, AX
	CMPQ BX, AX
	JAE  f14tail
	VMOVUPS     (SI)(BX*4), Z16
	VFMADD231PS (DI)(BX*4), Z16, Z0
	VFMADD231PS (R9)(BX*4), Z16, Z1
	VFMADD231PS (R10)(BX*4), Z16, Z2
	VFMADD231PS (R11)(BX*4), Z16, Z3
	ADDQ        $16, BX

f14tail:
	ANDQ $15, CX
	JZ   f14reduce
	TAILMASK
	VMOVUPS.Z   (SI)(BX*4), K1, Z16
	VMOVUPS.Z   (DI)(BX*4), K1, Z20
	VMOVUPS.Z   (R9)(BX*4), K1, Z21
	VMOVUPS.Z   (R10)(BX*4), K1, Z22
	VMOVUPS.Z   (R11)(BX*4), K1, Z23
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3

f14reduce:
	REDUCE4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0)
	MOVQ    out+32(FP), R8
	VMOVUPS X0, (R8)
	VZEROUPPER
	RET

// func dotAVX512(a *float32, b *float32, n int) float32
TEXT ·dotAVX512(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	XORQ BX, BX
	MOVQ CX, AX
	ANDQ $-64, AX
	JZ   dot16

dot64:
	VMOVUPS     (SI)(BX*4), Z4
	VMOVUPS     64(SI)(BX*4), Z5
	VMOVUPS     128(SI)(BX*4), Z6
	VMOVUPS     192(SI)(BX*4), Z7
	VFMADD231PS (DI)(BX*4), Z4, Z0
	VFMADD231PS 64(DI)(BX*4), Z5, Z1
	VFMADD231PS 128(DI)(BX*4), Z6, Z2
	VFMADD231PS 192(DI)(BX*4), Z7, Z3
	ADDQ        $64, BX
	CMPQ        BX, AX
	JB          dot64

dot16:
	MOVQ CX, AX
	ANDQ $-16, AX
	CMPQ BX, AX
	JAE  dottail

dot16loop:
	VMOVUPS     (SI)(BX*4), Z4
	VFMADD231PS (DI)(BX*4), Z4, Z0
	ADDQ        $16, BX
	CMPQ        BX, AX
	JB          dot16loop

dottail:
	ANDQ $15, CX
	JZ   dotreduce
	TAILMASK
	VMOVUPS.Z   (SI)(BX*4), K1, Z4
	VMOVUPS.Z   (DI)(BX*4), K1, Z5
	VFMADD231PS Z5, Z4, Z1

dotreduce:
	VADDPS Z1, Z0, Z0
	VADDPS Z3, Z2, Z2
	VADDPS Z2, Z0, Z0
	REDUCE1
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func bf16Dot1x4AVX512(x *float32, w *uint16, ws int, k int, out *float32)
// out[r] = Σ_j x[j] * bf16(w[r*ws+j]) for r < 4.
TEXT ·bf16Dot1x4AVX512(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ ws+16(FP), DX
	MOVQ k+24(FP), CX
	SHLQ $1, DX
	LEAQ (DI)(DX*1), R9   // w rows: DI, R9, R10, R11
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7
	XORQ BX, BX           // column index
	MOVQ CX, AX
	ANDQ $-32, AX
	JZ   b14one

b14loop:
	VMOVUPS     (SI)(BX*4), Z16
	VMOVUPS     64(SI)(BX*4), Z17
	BF16((DI)(BX*2), Z20)
	BF16((R9)(BX*2), Z21)
	BF16((R10)(BX*2), Z22)
	BF16((R11)(BX*2), Z23)
	BF16(32(DI)(BX*2), Z24)
	BF16(32(R9)(BX*2), Z25)
	BF16(32(R10)(BX*2), Z26)
	BF16(32(R11)(BX*2), Z27)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3
	VFMADD231PS Z24, Z17, Z0
	VFMADD231PS Z25, Z17, Z1
	VFMADD231PS Z26, Z17, Z2
	VFMADD231PS Z27, Z17, Z3
	ADDQ        $32, BX
	CMPQ        BX, AX
	JB          b14loop

b14one:
	MOVQ CX, AX
	ANDQ $-16, AX
	CMPQ BX, AX
	JAE  b14tail
	VMOVUPS     (SI)(BX*4), Z16
	BF16((DI)(BX*2), Z20)
	BF16((R9)(BX*2), Z21)
	BF16((R10)(BX*2), Z22)
	BF16((R11)(BX*2), Z23)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3
	ADDQ        $16, BX

b14tail:
	ANDQ $15, CX
	JZ   b14reduce
	TAILMASK
	VMOVUPS.Z   (SI)(BX*4), K1, Z16
	VMOVDQU16.Z (DI)(BX*2), K1, Y20
	VMOVDQU16.Z (R9)(BX*2), K1, Y21
	VMOVDQU16.Z (R10)(BX*2), K1, Y22
	VMOVDQU16.Z (R11)(BX*2), K1, Y23
	BF16(Y20, Z20)
	BF16(Y21, Z21)
	BF16(Y22, Z22)
	BF16(Y23, Z23)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3

b14reduce:
	REDUCE4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0)
	MOVQ    out+32(FP), R8
	VMOVUPS X0, (R8)
	VZEROUPPER
	RET

// func fp8Dot1x4AVX512(x *float32, w *uint8, ws int, k int, out *float32)
// out[r] = Σ_j x[j] * fp8(w[r*ws+j]) / 256 for r < 4.
TEXT ·fp8Dot1x4AVX512(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ ws+16(FP), DX
	MOVQ k+24(FP), CX
	LEAQ (DI)(DX*1), R9   // w rows: DI, R9, R10, R11
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	FP8MASK
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7
	XORQ BX, BX           // column index
	MOVQ CX, AX
	ANDQ $-32, AX
	JZ   e14one

e14loop:
	VMOVUPS     (SI)(BX*4), Z16
	VMOVUPS     64(SI)(BX*4), Z17
	FP8((DI)(BX*1), Y20, Z20)
	FP8((R9)(BX*1), Y21, Z21)
	FP8((R10)(BX*1), Y22, Z22)
	FP8((R11)(BX*1), Y23, Z23)
	FP8(16(DI)(BX*1), Y24, Z24)
	FP8(16(R9)(BX*1), Y25, Z25)
	FP8(16(R10)(BX*1), Y26, Z26)
	FP8(16(R11)(BX*1), Y27, Z27)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3
	VFMADD231PS Z24, Z17, Z0
	VFMADD231PS Z25, Z17, Z1
	VFMADD231PS Z26, Z17, Z2
	VFMADD231PS Z27, Z17, Z3
	ADDQ        $32, BX
	CMPQ        BX, AX
	JB          e14loop

e14one:
	MOVQ CX, AX
	ANDQ $-16, AX
	CMPQ BX, AX
	JAE  e14tail
	VMOVUPS     (SI)(BX*4), Z16
	FP8((DI)(BX*1), Y20, Z20)
	FP8((R9)(BX*1), Y21, Z21)
	FP8((R10)(BX*1), Y22, Z22)
	FP8((R11)(BX*1), Y23, Z23)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3
	ADDQ        $16, BX

e14tail:
	ANDQ $15, CX
	JZ   e14reduce
	TAILMASK
	VMOVUPS.Z  (SI)(BX*4), K1, Z16
	VMOVDQU8.Z (DI)(BX*1), K1, X20
	VMOVDQU8.Z (R9)(BX*1), K1, X21
	VMOVDQU8.Z (R10)(BX*1), K1, X22
	VMOVDQU8.Z (R11)(BX*1), K1, X23
	FP8(X20, Y20, Z20)
	FP8(X21, Y21, Z21)
	FP8(X22, Y22, Z22)
	FP8(X23, Y23, Z23)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3

e14reduce:
	REDUCE4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0)
	MOVQ    out+32(FP), R8
	VMOVUPS X0, (R8)
	VZEROUPPER
	RET

// func bf16ToF32AVX512(dst *float32, src *uint16, n int)
TEXT ·bf16ToF32AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ BX, BX
	MOVQ CX, AX
	ANDQ $-16, AX
	JZ   cbtail

cbloop:
	BF16((SI)(BX*2), Z0)
	VMOVUPS Z0, (DI)(BX*4)
	ADDQ    $16, BX
	CMPQ    BX, AX
	JB      cbloop

cbtail:
	ANDQ $15, CX
	JZ   cbdone
	TAILMASK
	VMOVDQU16.Z (SI)(BX*2), K1, Y0
	BF16(Y0, Z0)
	VMOVUPS     Z0, K1, (DI)(BX*4)

cbdone:
	VZEROUPPER
	RET

// func fp8ToF32AVX512(dst *float32, src *uint8, n int, mul float32)
// dst[j] = fp8(src[j]) / 256 * mul.
TEXT ·fp8ToF32AVX512(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS mul+24(FP), Z30
	FP8MASK
	XORQ         BX, BX
	MOVQ         CX, AX
	ANDQ         $-16, AX
	JZ           cetail

celoop:
	FP8((SI)(BX*1), Y0, Z0)
	VMULPS  Z30, Z0, Z0
	VMOVUPS Z0, (DI)(BX*4)
	ADDQ    $16, BX
	CMPQ    BX, AX
	JB      celoop

cetail:
	ANDQ $15, CX
	JZ   cedone
	TAILMASK
	VMOVDQU8.Z (SI)(BX*1), K1, X0
	FP8(X0, Y0, Z0)
	VMULPS     Z30, Z0, Z0
	VMOVUPS    Z0, K1, (DI)(BX*4)

cedone:
	VZEROUPPER
	RET

// func axpyAVX512(y *float32, alpha float32, x *float32, n int)
// y[j] += alpha * x[j].
TEXT ·axpyAVX512(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	VBROADCASTSS alpha+8(FP), Z31
	MOVQ         x+16(FP), SI
	MOVQ         n+24(FP), CX
	XORQ         BX, BX
	MOVQ         CX, AX
	ANDQ         $-64, AX
	JZ           ax16

ax64:
	VMOVUPS     (SI)(BX*4), Z0
	VMOVUPS     64(SI)(BX*4), Z1
	VMOVUPS     128(SI)(BX*4), Z2
	VMOVUPS     192(SI)(BX*4), Z3
	VFMADD213PS (DI)(BX*4), Z31, Z0
	VFMADD213PS 64(DI)(BX*4), Z31, Z1
	VFMADD213PS 128(DI)(BX*4), Z31, Z2
	VFMADD213PS 192(DI)(BX*4), Z31, Z3
	VMOVUPS     Z0, (DI)(BX*4)
	VMOVUPS     Z1, 64(DI)(BX*4)
	VMOVUPS     Z2, 128(DI)(BX*4)
	VMOVUPS     Z3, 192(DI)(BX*4)
	ADDQ        $64, BX
	CMPQ        BX, AX
	JB          ax64

ax16:
	MOVQ CX, AX
	ANDQ $-16, AX
	CMPQ BX, AX
	JAE  axtail

ax16loop:
	VMOVUPS     (SI)(BX*4), Z0
	VFMADD213PS (DI)(BX*4), Z31, Z0
	VMOVUPS     Z0, (DI)(BX*4)
	ADDQ        $16, BX
	CMPQ        BX, AX
	JB          ax16loop

axtail:
	ANDQ $15, CX
	JZ   axdone
	TAILMASK
	VMOVUPS.Z   (SI)(BX*4), K1, Z0
	VMOVUPS.Z   (DI)(BX*4), K1, Z1
	VFMADD213PS Z1, Z31, Z0
	VMOVUPS     Z0, K1, (DI)(BX*4)

axdone:
	VZEROUPPER
	RET

// func scaleAVX512(y *float32, alpha float32, n int)
// y[j] *= alpha.
TEXT ·scaleAVX512(SB), NOSPLIT, $0-24
	MOVQ         y+0(FP), DI
	VBROADCASTSS alpha+8(FP), Z31
	MOVQ         n+16(FP), CX
	XORQ         BX, BX
	MOVQ         CX, AX
	ANDQ         $-64, AX
	JZ           sc16

sc64:
	VMULPS  (DI)(BX*4), Z31, Z0
	VMULPS  64(DI)(BX*4), Z31, Z1
	VMULPS  128(DI)(BX*4), Z31, Z2
	VMULPS  192(DI)(BX*4), Z31, Z3
	VMOVUPS Z0, (DI)(BX*4)
	VMOVUPS Z1, 64(DI)(BX*4)
	VMOVUPS Z2, 128(DI)(BX*4)
	VMOVUPS Z3, 192(DI)(BX*4)
	ADDQ    $64, BX
	CMPQ    BX, AX
	JB      sc64

sc16:
	MOVQ CX, AX
	ANDQ $-16, AX
	CMPQ BX, AX
	JAE  sctail

sc16loop:
	VMULPS  (DI)(BX*4), Z31, Z0
	VMOVUPS Z0, (DI)(BX*4)
	ADDQ    $16, BX
	CMPQ    BX, AX
	JB      sc16loop

sctail:
	ANDQ $15, CX
	JZ   scdone
	TAILMASK
	VMOVUPS.Z (DI)(BX*4), K1, Z0
	VMULPS    Z0, Z31, Z0
	VMOVUPS   Z0, K1, (DI)(BX*4)

scdone:
	VZEROUPPER
	RET

// func bf16Dot4x4AVX512(x *float32, xs int, w *uint16, ws int, k int, out *float32, os int)
// out[t*os+r] = Σ_j x[t*xs+j] * bf16(w[r*ws+j]) for t, r < 4: each
// decoded W vector serves four x rows.
TEXT ·bf16Dot4x4AVX512(SB), NOSPLIT, $0-56
	ROWS4(1)
	ZERO16
	XORQ BX, BX           // column index
	MOVQ CX, AX
	ANDQ $-16, AX
	JZ   b44tail

b44loop:
	LOADX4
	BF16((DI)(BX*2), Z20)
	BF16((R12)(BX*2), Z21)
	BF16((R13)(BX*2), Z22)
	BF16((R8)(BX*2), Z23)
	F44FMA
	ADDQ $16, BX
	CMPQ BX, AX
	JB   b44loop

b44tail:
	ANDQ $15, CX
	JZ   b44reduce
	TAILMASK
	LOADX4TAIL
	VMOVDQU16.Z (DI)(BX*2), K1, Y20
	VMOVDQU16.Z (R12)(BX*2), K1, Y21
	VMOVDQU16.Z (R13)(BX*2), K1, Y22
	VMOVDQU16.Z (R8)(BX*2), K1, Y23
	BF16(Y20, Z20)
	BF16(Y21, Z21)
	BF16(Y22, Z22)
	BF16(Y23, Z23)
	F44FMA

b44reduce:
	MOVQ out+40(FP), DI
	MOVQ os+48(FP), DX
	SHLQ $2, DX
	STORE4x4
	VZEROUPPER
	RET

// func fp8Dot4x4AVX512(x *float32, xs int, w *uint8, ws int, k int, out *float32, os int)
// out[t*os+r] = Σ_j x[t*xs+j] * fp8(w[r*ws+j]) / 256 for t, r < 4.
TEXT ·fp8Dot4x4AVX512(SB), NOSPLIT, $0-56
	ROWS4(0)
	FP8MASK
	ZERO16
	XORQ BX, BX           // column index
	MOVQ CX, AX
	ANDQ $-16, AX
	JZ   e44tail

e44loop:
	LOADX4
	FP8((DI)(BX*1), Y20, Z20)
	FP8((R12)(BX*1), Y21, Z21)
	FP8((R13)(BX*1), Y22, Z22)
	FP8((R8)(BX*1), Y23, Z23)
	F44FMA
	ADDQ $16, BX
	CMPQ BX, AX
	JB   e44loop

e44tail:
	ANDQ $15, CX
	JZ   e44reduce
	TAILMASK
	LOADX4TAIL
	VMOVDQU8.Z (DI)(BX*1), K1, X20
	VMOVDQU8.Z (R12)(BX*1), K1, X21
	VMOVDQU8.Z (R13)(BX*1), K1, X22
	VMOVDQU8.Z (R8)(BX*1), K1, X23
	FP8(X20, Y20, Z20)
	FP8(X21, Y21, Z21)
	FP8(X22, Y22, Z22)
	FP8(X23, Y23, Z23)
	F44FMA

e44reduce:
	MOVQ out+40(FP), DI
	MOVQ os+48(FP), DX
	SHLQ $2, DX
	STORE4x4
	VZEROUPPER
	RET

// FGLOOPBODY, BGLOOPBODY and EGLOOPBODY are one 32-column step of the
// F32, BF16 and FP8 GEMV quads, prefetching with the instruction PF.
#define FGLOOPBODY(PF) \
	PF          (R12); \
	PF          64(R12); \
	PF          128(R12); \
	PF          192(R12); \
	PF          256(R12); \
	PF          320(R12); \
	PF          384(R12); \
	PF          448(R12); \
	ADDQ        $512, R12; \
	VMOVUPS     (SI)(BX*4), Z16; \
	VMOVUPS     64(SI)(BX*4), Z17; \
	VFMADD231PS (DI)(BX*4), Z16, Z0; \
	VFMADD231PS (R9)(BX*4), Z16, Z1; \
	VFMADD231PS (R10)(BX*4), Z16, Z2; \
	VFMADD231PS (R11)(BX*4), Z16, Z3; \
	VFMADD231PS 64(DI)(BX*4), Z17, Z0; \
	VFMADD231PS 64(R9)(BX*4), Z17, Z1; \
	VFMADD231PS 64(R10)(BX*4), Z17, Z2; \
	VFMADD231PS 64(R11)(BX*4), Z17, Z3

#define BGLOOPBODY(PF) \
	PF          (R12)(BX*8); \
	PF          64(R12)(BX*8); \
	PF          128(R12)(BX*8); \
	PF          192(R12)(BX*8); \
	VMOVUPS     (SI)(BX*4), Z16; \
	VMOVUPS     64(SI)(BX*4), Z17; \
	BF16((DI)(BX*2), Z20); \
	BF16((R9)(BX*2), Z21); \
	BF16((R10)(BX*2), Z22); \
	BF16((R11)(BX*2), Z23); \
	BF16(32(DI)(BX*2), Z24); \
	BF16(32(R9)(BX*2), Z25); \
	BF16(32(R10)(BX*2), Z26); \
	BF16(32(R11)(BX*2), Z27); \
	VFMADD231PS Z20, Z16, Z0; \
	VFMADD231PS Z21, Z16, Z1; \
	VFMADD231PS Z22, Z16, Z2; \
	VFMADD231PS Z23, Z16, Z3; \
	VFMADD231PS Z24, Z17, Z0; \
	VFMADD231PS Z25, Z17, Z1; \
	VFMADD231PS Z26, Z17, Z2; \
	VFMADD231PS Z27, Z17, Z3

#define EGLOOPBODY(PF) \
	PF          (R12)(BX*4); \
	PF          64(R12)(BX*4); \
	VMOVUPS     (SI)(BX*4), Z16; \
	VMOVUPS     64(SI)(BX*4), Z17; \
	FP8((DI)(BX*1), Y20, Z20); \
	FP8((R9)(BX*1), Y21, Z21); \
	FP8((R10)(BX*1), Y22, Z22); \
	FP8((R11)(BX*1), Y23, Z23); \
	FP8(16(DI)(BX*1), Y24, Z24); \
	FP8(16(R9)(BX*1), Y25, Z25); \
	FP8(16(R10)(BX*1), Y26, Z26); \
	FP8(16(R11)(BX*1), Y27, Z27); \
	VFMADD231PS Z20, Z16, Z0; \
	VFMADD231PS Z21, Z16, Z1; \
	VFMADD231PS Z22, Z16, Z2; \
	VFMADD231PS Z23, Z16, Z3; \
	VFMADD231PS Z24, Z17, Z0; \
	VFMADD231PS Z25, Z17, Z1; \
	VFMADD231PS Z26, Z17, Z2; \
	VFMADD231PS Z27, Z17, Z3

// func f32GemvAVX512(x *float32, w *float32, ws int, k int, quads int, out *float32, pf int, far bool)
// out[r] = Σ_j x[j] * w[r*ws+j] for r < 4*quads.
TEXT ·f32GemvAVX512(SB), NOSPLIT, $0-57
	GEMVSETUP(2)

fgquad:
	GEMVQUAD
	CMPQ BX, AX
	JAE  fgone

	MOVBQZX far+56(FP), R12
	TESTQ   R12, R12
	MOVQ    pf+48(FP), R12
	LEAQ    (DI)(R12*1), R12
	JNZ     fgloop1

fgloop0:
	FGLOOPBODY(PREFETCHT0)
	ADDQ $32, BX
	CMPQ BX, AX
	JB   fgloop0
	JMP  fgone

fgloop1:
	FGLOOPBODY(PREFETCHT1)
	ADDQ $32, BX
	CMPQ BX, AX
	JB   fgloop1

fgone:
	CMPQ BX, R13
	JAE  fgtail
	VMOVUPS     (SI)(BX*4), Z16
	VFMADD231PS (DI)(BX*4), Z16, Z0
	VFMADD231PS (R9)(BX*4), Z16, Z1
	VFMADD231PS (R10)(BX*4), Z16, Z2
	VFMADD231PS (R11)(BX*4), Z16, Z3
	ADDQ        $16, BX

fgtail:
	TESTQ $15, CX
	JZ    fgreduce
	VMOVUPS.Z   (SI)(BX*4), K1, Z16
	VMOVUPS.Z   (DI)(BX*4), K1, Z20
	VMOVUPS.Z   (R9)(BX*4), K1, Z21
	VMOVUPS.Z   (R10)(BX*4), K1, Z22
	VMOVUPS.Z   (R11)(BX*4), K1, Z23
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3

fgreduce:
	GEMVSTORE(fgquad)
	VZEROUPPER
	RET

// func bf16GemvAVX512(x *float32, w *uint16, ws int, k int, quads int, out *float32, pf int, far bool)
// out[r] = Σ_j x[j] * bf16(w[r*ws+j]) for r < 4*quads.
TEXT ·bf16GemvAVX512(SB), NOSPLIT, $0-57
	GEMVSETUP(1)

bgquad:
	GEMVQUAD
	CMPQ BX, AX
	JAE  bgone

	MOVBQZX far+56(FP), R12
	TESTQ   R12, R12
	MOVQ    pf+48(FP), R12
	LEAQ    (DI)(R12*1), R12
	JNZ     bgloop1

bgloop0:
	BGLOOPBODY(PREFETCHT0)
	ADDQ $32, BX
	CMPQ BX, AX
	JB   bgloop0
	JMP  bgone

bgloop1:
	BGLOOPBODY(PREFETCHT1)
	ADDQ $32, BX
	CMPQ BX, AX
	JB   bgloop1

bgone:
	CMPQ BX, R13
	JAE  bgtail
	VMOVUPS     (SI)(BX*4), Z16
	BF16((DI)(BX*2), Z20)
	BF16((R9)(BX*2), Z21)
	BF16((R10)(BX*2), Z22)
	BF16((R11)(BX*2), Z23)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3
	ADDQ        $16, BX

bgtail:
	TESTQ $15, CX
	JZ    bgreduce
	VMOVUPS.Z   (SI)(BX*4), K1, Z16
	VMOVDQU16.Z (DI)(BX*2), K1, Y20
	VMOVDQU16.Z (R9)(BX*2), K1, Y21
	VMOVDQU16.Z (R10)(BX*2), K1, Y22
	VMOVDQU16.Z (R11)(BX*2), K1, Y23
	BF16(Y20, Z20)
	BF16(Y21, Z21)
	BF16(Y22, Z22)
	BF16(Y23, Z23)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3

bgreduce:
	GEMVSTORE(bgquad)
	VZEROUPPER
	RET

// func fp8GemvAVX512(x *float32, w *uint8, ws int, k int, quads int, out *float32, pf int, far bool)
// out[r] = Σ_j x[j] * fp8(w[r*ws+j]) / 256 for r < 4*quads.
TEXT ·fp8GemvAVX512(SB), NOSPLIT, $0-57
	GEMVSETUP(0)
	MOVL         $0xBF80, BX
	VPBROADCASTW BX, Y31

egquad:
	GEMVQUAD
	CMPQ BX, AX
	JAE  egone

	MOVBQZX far+56(FP), R12
	TESTQ   R12, R12
	MOVQ    pf+48(FP), R12
	LEAQ    (DI)(R12*1), R12
	JNZ     egloop1

egloop0:
	EGLOOPBODY(PREFETCHT0)
	ADDQ $32, BX
	CMPQ BX, AX
	JB   egloop0
	JMP  egone

egloop1:
	EGLOOPBODY(PREFETCHT1)
	ADDQ $32, BX
	CMPQ BX, AX
	JB   egloop1

egone:
	CMPQ BX, R13
	JAE  egtail
	VMOVUPS     (SI)(BX*4), Z16
	FP8((DI)(BX*1), Y20, Z20)
	FP8((R9)(BX*1), Y21, Z21)
	FP8((R10)(BX*1), Y22, Z22)
	FP8((R11)(BX*1), Y23, Z23)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3
	ADDQ        $16, BX

egtail:
	TESTQ $15, CX
	JZ    egreduce
	VMOVUPS.Z  (SI)(BX*4), K1, Z16
	VMOVDQU8.Z (DI)(BX*1), K1, X20
	VMOVDQU8.Z (R9)(BX*1), K1, X21
	VMOVDQU8.Z (R10)(BX*1), K1, X22
	VMOVDQU8.Z (R11)(BX*1), K1, X23
	FP8(X20, Y20, Z20)
	FP8(X21, Y21, Z21)
	FP8(X22, Y22, Z22)
	FP8(X23, Y23, Z23)
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3

egreduce:
	GEMVSTORE(egquad)
	VZEROUPPER
	RET

// func f32Gemm4AVX512(x0, x1, x2, x3 *float32, w *float32, ws, k, quads int, out *float32, os, nx int, far bool)
// out[t*os+r] = Σ_j x_t[j] * w[r*ws+j] for t < nx, r < 4*quads.
TEXT ·f32Gemm4AVX512(SB), NOSPLIT, $0-89
	GEMM4(2, PF4, W4F32, W4F32TAIL, fq4, fl40, fl41, ft4, fs4)

// func bf16Gemm4AVX512(x0, x1, x2, x3 *float32, w *uint16, ws, k, quads int, out *float32, os, nx int, far bool)
TEXT ·bf16Gemm4AVX512(SB), NOSPLIT, $0-89
	GEMM4(1, PF2, W4BF16, W4BF16TAIL, bq4, bl40, bl41, bt4, bs4)

// func fp8Gemm4AVX512(x0, x1, x2, x3 *float32, w *uint8, ws, k, quads int, out *float32, os, nx int, far bool)
// The products are raw (fp8/256), as for the other FP8 kernels.
TEXT ·fp8Gemm4AVX512(SB), NOSPLIT, $0-89
	FP8MASK
	GEMM4(0, PF1, W4FP8, W4FP8TAIL, eq4, el40, el41, et4, es4)

// func f32Gemm2AVX512(x0, x1, x2, x3 *float32, w *float32, ws, k, quads int, out *float32, os, nx int, far bool)
// out[t*os+r] = Σ_j x_t[j] * w[r*ws+j] for t < 2, r < 4*quads; x2, x3
// and nx are unused.
TEXT ·f32Gemm2AVX512(SB), NOSPLIT, $0-89
	GEMM2(2, PF4, W4F32, W4F32TAIL, fq2, fl20, fl21, ft2, fs2)

// func bf16Gemm2AVX512(x0, x1, x2, x3 *float32, w *uint16, ws, k, quads int, out *float32, os, nx int, far bool)
TEXT ·bf16Gemm2AVX512(SB), NOSPLIT, $0-89
	GEMM2(1, PF2, W4BF16, W4BF16TAIL, bq2, bl20, bl21, bt2, bs2)

// func fp8Gemm2AVX512(x0, x1, x2, x3 *float32, w *uint8, ws, k, quads int, out *float32, os, nx int, far bool)
TEXT ·fp8Gemm2AVX512(SB), NOSPLIT, $0-89
	FP8MASK
	GEMM2(0, PF1, W4FP8, W4FP8TAIL, eq2, el20, el21, et2, es2)

// EXPCONSTS loads the constants of EXP into Z20-Z31: the input clamp, the
// split of ln 2 for range reduction, and the Cephes expf polynomial.
#define EXPCONSTS \
	MOVL $0x42b0c0a5, AX; VPBROADCASTD AX, Z20; \
	MOVL $0xc2b0c0a5, AX; VPBROADCASTD AX, Z21; \
	MOVL $0x3fb8aa3b, AX; VPBROADCASTD AX, Z22; \
	MOVL $0x3f318000, AX; VPBROADCASTD AX, Z23; \
	MOVL $0xb95e8083, AX; VPBROADCASTD AX, Z24; \
	MOVL $0x39506967, AX; VPBROADCASTD AX, Z25; \
	MOVL $0x3ab743ce, AX; VPBROADCASTD AX, Z26; \
	MOVL $0x3c088908, AX; VPBROADCASTD AX, Z27; \
	MOVL $0x3d2aa9c1, AX; VPBROADCASTD AX, Z28; \
	MOVL $0x3e2aaaaa, AX; VPBROADCASTD AX, Z29; \
	MOVL $0x3f000000, AX; VPBROADCASTD AX, Z30; \
	MOVL $0x3f800000, AX; VPBROADCASTD AX, Z31

// EXP replaces the 16 lanes of zx with exp(zx), within 2 ulp, clamping
// the input to ±88.38 so the result stays finite. zn and zt are
// clobbered; Z20-Z31 hold EXPCONSTS. exp(x) = 2^n · e^r with
// n = round(x·log2 e) and r = x - n·ln 2; e^r is a degree-7 polynomial.
#define EXP(zx, zn, zt) \
	VMINPS       Z20, zx, zx; \
	VMAXPS       Z21, zx, zx; \
	VMULPS       Z22, zx, zn; \
	VRNDSCALEPS  $0, zn, zn; \
	VFNMADD231PS Z23, zn, zx; \
	VFNMADD231PS Z24, zn, zx; \
	VMOVAPS      Z25, zt; \
	VFMADD213PS  Z26, zx, zt; \
	VFMADD213PS  Z27, zx, zt; \
	VFMADD213PS  Z28, zx, zt; \
	VFMADD213PS  Z29, zx, zt; \
	VFMADD213PS  Z30, zx, zt; \
	VMULPS       zx, zt, zt; \
	VFMADD213PS  zx, zx, zt; \
	VADDPS       Z31, zt, zt; \
	VSCALEFPS    zn, zt, zx

// func expSumAVX512(x *float32, n int, shift float32) float32
// x[j] = exp(x[j] - shift); returns Σ x[j].
TEXT ·expSumAVX512(SB), NOSPLIT, $0-28
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS shift+16(FP), Z19
	EXPCONSTS
	VPXORD       Z12, Z12, Z12
	VPXORD       Z13, Z13, Z13
	XORQ         BX, BX
	MOVQ         CX, AX
	ANDQ         $-32, AX
	JZ           es16

es32:
	VMOVUPS (DI)(BX*4), Z0
	VMOVUPS 64(DI)(BX*4), Z3
	VSUBPS  Z19, Z0, Z0
	VSUBPS  Z19, Z3, Z3
	EXP(Z0, Z1, Z2)
	EXP(Z3, Z4, Z5)
	VMOVUPS Z0, (DI)(BX*4)
	VMOVUPS Z3, 64(DI)(BX*4)
	VADDPS  Z0, Z12, Z12
	VADDPS  Z3, Z13, Z13
	ADDQ    $32, BX
	CMPQ    BX, AX
	JB      es32

es16:
	MOVQ CX, AX
	ANDQ $-16, AX
	CMPQ BX, AX
	JAE  estail
	VMOVUPS (DI)(BX*4), Z0
	VSUBPS  Z19, Z0, Z0
	EXP(Z0, Z1, Z2)
	VMOVUPS Z0, (DI)(BX*4)
	VADDPS  Z0, Z12, Z12
	ADDQ    $16, BX

estail:
	ANDQ $15, CX
	JZ   esreduce
	TAILMASK
	VMOVUPS.Z (DI)(BX*4), K1, Z0
	VSUBPS    Z19, Z0, Z0
	EXP(Z0, Z1, Z2)
	VMOVUPS   Z0, K1, (DI)(BX*4)
	VADDPS    Z0, Z12, K1, Z12

esreduce:
	VADDPS Z13, Z12, Z0
	REDUCE1
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// SILUMUL replaces gate's 16 lanes at mem offset off with
// silu(gate)·up = gate·up / (1 + exp(-gate)). Z19 is zero.
#define SILUMUL(off, zg, zx, zn, zt) \
	VMOVUPS off(DI)(BX*4), zg; \
	VSUBPS  zg, Z19, zx; \
	EXP(zx, zn, zt); \
	VADDPS  Z31, zx, zx; \
	VMULPS  off(SI)(BX*4), zg, zg; \
	VDIVPS  zx, zg, zg; \
	VMOVUPS zg, off(DI)(BX*4)

// func siluMulAVX512(gate *float32, up *float32, n int)
// gate[j] = silu(gate[j]) * up[j].
TEXT ·siluMulAVX512(SB), NOSPLIT, $0-24
	MOVQ   gate+0(FP), DI
	MOVQ   up+8(FP), SI
	MOVQ   n+16(FP), CX
	EXPCONSTS
	VPXORD Z19, Z19, Z19
	XORQ   BX, BX
	MOVQ   CX, AX
	ANDQ   $-32, AX
	JZ     sm16

sm32:
	SILUMUL(0, Z0, Z1, Z2, Z3)
	SILUMUL(64, Z4, Z5, Z6, Z7)
	ADDQ $32, BX
	CMPQ BX, AX
	JB   sm32

sm16:
	MOVQ CX, AX
	ANDQ $-16, AX
	CMPQ BX, AX
	JAE  smtail
	SILUMUL(0, Z0, Z1, Z2, Z3)
	ADDQ $16, BX

smtail:
	ANDQ $15, CX
	JZ   smdone
	TAILMASK
	VMOVUPS.Z (DI)(BX*4), K1, Z0
	VMOVUPS.Z (SI)(BX*4), K1, Z4
	VSUBPS    Z0, Z19, Z1
	EXP(Z1, Z2, Z3)
	VADDPS    Z31, Z1, Z1
	VMULPS    Z4, Z0, Z0
	VDIVPS    Z1, Z0, Z0
	VMOVUPS   Z0, K1, (DI)(BX*4)

smdone:
	VZEROUPPER
	RET

// WSUMROW adds the broadcast weight at mem times the four vectors
// Z16-Z19 to the accumulators za-zd.
#define WSUMROW(mem, zw, za, zb, zc, zd) \
	VBROADCASTSS mem, zw; \
	VFMADD231PS  Z16, zw, za; \
	VFMADD231PS  Z17, zw, zb; \
	VFMADD231PS  Z18, zw, zc; \
	VFMADD231PS  Z19, zw, zd

// func wsum4x64AVX512(p0, p1, p2, p3 *float32, v *float32, vs, n int, o0, o1, o2, o3 *float32)
// o_r[j] += Σ_q p_r[q] * v[q*vs+j] for r < 4, j < 64, q < n (n >= 1).
TEXT ·wsum4x64AVX512(SB), NOSPLIT, $0-88
	MOVQ    p0+0(FP), R8
	MOVQ    p1+8(FP), R9
	MOVQ    p2+16(FP), R10
	MOVQ    p3+24(FP), R11
	MOVQ    v+32(FP), SI
	MOVQ    vs+40(FP), DX
	SHLQ    $2, DX
	MOVQ    n+48(FP), CX
	MOVQ    o0+56(FP), AX
	MOVQ    o1+64(FP), R12
	MOVQ    o2+72(FP), R13
	MOVQ    o3+80(FP), R14
	VMOVUPS (AX), Z0
	VMOVUPS 64(AX), Z1
	VMOVUPS 128(AX), Z2
	VMOVUPS 192(AX), Z3
	VMOVUPS (R12), Z4
	VMOVUPS 64(R12), Z5
	VMOVUPS 128(R12), Z6
	VMOVUPS 192(R12), Z7
	VMOVUPS (R13), Z8
	VMOVUPS 64(R13), Z9
	VMOVUPS 128(R13), Z10
	VMOVUPS 192(R13), Z11
	VMOVUPS (R14), Z12
	VMOVUPS 64(R14), Z13
	VMOVUPS 128(R14), Z14
	VMOVUPS 192(R14), Z15
	XORQ    BX, BX

ws64:
	VMOVUPS (SI), Z16
	VMOVUPS 64(SI), Z17
	VMOVUPS 128(SI), Z18
	VMOVUPS 192(SI), Z19
	WSUMROW((R8)(BX*4), Z20, Z0, Z1, Z2, Z3)
	WSUMROW((R9)(BX*4), Z21, Z4, Z5, Z6, Z7)
	WSUMROW((R10)(BX*4), Z22, Z8, Z9, Z10, Z11)
	WSUMROW((R11)(BX*4), Z23, Z12, Z13, Z14, Z15)
	ADDQ    DX, SI
	INCQ    BX
	CMPQ    BX, CX
	JB      ws64

	VMOVUPS Z0, (AX)
	VMOVUPS Z1, 64(AX)
	VMOVUPS Z2, 128(AX)
	VMOVUPS Z3, 192(AX)
	VMOVUPS Z4, (R12)
	VMOVUPS Z5, 64(R12)
	VMOVUPS Z6, 128(R12)
	VMOVUPS Z7, 192(R12)
	VMOVUPS Z8, (R13)
	VMOVUPS Z9, 64(R13)
	VMOVUPS Z10, 128(R13)
	VMOVUPS Z11, 192(R13)
	VMOVUPS Z12, (R14)
	VMOVUPS Z13, 64(R14)
	VMOVUPS Z14, 128(R14)
	VMOVUPS Z15, 192(R14)
	VZEROUPPER
	RET

// func wsum4x16AVX512(p0, p1, p2, p3 *float32, v *float32, vs, n, cols int, o0, o1, o2, o3 *float32)
// o_r[j] += Σ_q p_r[q] * v[q*vs+j] for r < 4, j < cols (1 to 16), q < n
// (n >= 1).
TEXT ·wsum4x16AVX512(SB), NOSPLIT, $0-96
	MOVQ      p0+0(FP), R8
	MOVQ      p1+8(FP), R9
	MOVQ      p2+16(FP), R10
	MOVQ      p3+24(FP), R11
	MOVQ      v+32(FP), SI
	MOVQ      vs+40(FP), DX
	SHLQ      $2, DX
	MOVQ      cols+56(FP), CX
	TAILMASK
	MOVQ      n+48(FP), CX
	MOVQ      o0+64(FP), AX
	MOVQ      o1+72(FP), R12
	MOVQ      o2+80(FP), R13
	MOVQ      o3+88(FP), R14
	VMOVUPS.Z (AX), K1, Z0
	VMOVUPS.Z (R12), K1, Z1
	VMOVUPS.Z (R13), K1, Z2
	VMOVUPS.Z (R14), K1, Z3
	XORQ      BX, BX

ws16:
	VMOVUPS.Z    (SI), K1, Z16
	VBROADCASTSS (R8)(BX*4), Z20
	VBROADCASTSS (R9)(BX*4), Z21
	VBROADCASTSS (R10)(BX*4), Z22
	VBROADCASTSS (R11)(BX*4), Z23
	VFMADD231PS  Z16, Z20, Z0
	VFMADD231PS  Z16, Z21, Z1
	VFMADD231PS  Z16, Z22, Z2
	VFMADD231PS  Z16, Z23, Z3
	ADDQ         DX, SI
	INCQ         BX
	CMPQ         BX, CX
	JB           ws16

	VMOVUPS Z0, K1, (AX)
	VMOVUPS Z1, K1, (R12)
	VMOVUPS Z2, K1, (R13)
	VMOVUPS Z3, K1, (R14)
	VZEROUPPER
	RET

// func fmaPeakAVX512(iters int)
// Runs 12 independent chains of VFMADD231PS on zmm, 12 per iteration: the
// FMA throughput the arithmetic-bound kernels are measured against.
TEXT ·fmaPeakAVX512(SB), NOSPLIT, $0-8
	MOVQ   iters+0(FP), CX
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11
	VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15

peakloop:
	VFMADD231PS Z14, Z15, Z0; VFMADD231PS Z14, Z15, Z1; VFMADD231PS Z14, Z15, Z2
	VFMADD231PS Z14, Z15, Z3; VFMADD231PS Z14, Z15, Z4; VFMADD231PS Z14, Z15, Z5
	VFMADD231PS Z14, Z15, Z6; VFMADD231PS Z14, Z15, Z7; VFMADD231PS Z14, Z15, Z8
	VFMADD231PS Z14, Z15, Z9; VFMADD231PS Z14, Z15, Z10; VFMADD231PS Z14, Z15, Z11
	DECQ        CX
	JNZ         peakloop
	VZEROUPPER
	RET

// func scaleToAVX512(dst *float32, src *float32, alpha float32, n int)
// dst[j] = src[j] * alpha.
TEXT ·scaleToAVX512(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	VBROADCASTSS alpha+16(FP), Z31
	MOVQ         n+24(FP), CX
	XORQ         BX, BX
	MOVQ         CX, AX
	ANDQ         $-16, AX

st16:
	CMPQ    BX, AX
	JAE     sttail
	VMULPS  (SI)(BX*4), Z31, Z0
	VMOVUPS Z0, (DI)(BX*4)
	ADDQ    $16, BX
	JMP     st16

sttail:
	ANDQ $15, CX
	JZ   stdone
	TAILMASK
	VMOVUPS.Z (SI)(BX*4), K1, Z0
	VMULPS    Z0, Z31, Z0
	VMOVUPS   Z0, K1, (DI)(BX*4)

stdone:
	VZEROUPPER
	RET

// func maxAVX512(x *float32, n int) float32
// The largest of x[0..n), n % 16 == 0 and n > 0, four vectors per step.
TEXT ·maxAVX512(SB), NOSPLIT, $0-20
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	VMOVUPS (SI), Z0
	VMOVAPS Z0, Z1
	VMOVAPS Z0, Z2
	VMOVAPS Z0, Z3
	MOVQ    CX, AX
	ANDQ    $-64, AX
	XORQ    BX, BX

mz64:
	CMPQ   BX, AX
	JAE    mz16
	VMAXPS (SI)(BX*4), Z0, Z0
	VMAXPS 64(SI)(BX*4), Z1, Z1
	VMAXPS 128(SI)(BX*4), Z2, Z2
	VMAXPS 192(SI)(BX*4), Z3, Z3
	ADDQ   $64, BX
	JMP    mz64

mz16:
	CMPQ   BX, CX
	JAE    mzdone
	VMAXPS (SI)(BX*4), Z0, Z0
	ADDQ   $16, BX
	JMP    mz16

mzdone:
	VMAXPS        Z1, Z0, Z0
	VMAXPS        Z3, Z2, Z2
	VMAXPS        Z2, Z0, Z0
	VEXTRACTF32X8 $1, Z0, Y1
	VMAXPS        Y1, Y0, Y0
	VEXTRACTF128  $1, Y0, X1
	VMAXPS        X1, X0, X0
	VPERMILPS     $0x4E, X0, X1
	VMAXPS        X1, X0, X0
	VPERMILPS     $0xB1, X0, X1
	VMAXPS        X1, X0, X0
	VMOVSS        X0, ret+16(FP)
	VZEROUPPER
	RET
