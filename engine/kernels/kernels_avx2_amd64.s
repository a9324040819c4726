//go:build amd64 && !purego

#include "textflag.h"

// AVX2+FMA+F16C kernels for CPUs without AVX-512. Vectors are 8 float32 in
// a ymm register; there are only 16 of them, so tiles are 4x3 or 2x4.
// Every kernel handles k (or n) rounded down to a multiple of 8;
// the Go wrappers add the remaining columns. Decoding is as in the AVX-512
// kernels (see kernels_amd64.s).
//
// Every kernel that produces a row's dot product (4x3 and 2x4 tiles, GEMV,
// GEMM2) sums it in the same order: one accumulator per output, 8-column
// blocks in sequence, then HSUM4's tree (a 4x3 tile passes its third
// accumulator twice, which sums it by the same tree); the Go wrappers then add the last k%8
// columns in order. So a product does not depend on the batch it is in,
// the tile that computed it or the thread that ran it.

// HSUM4 sums each of the ymm accumulators ya..yd across its 8 lanes and
// leaves the four sums in lanes 0..3 of xa. Clobbers yb, yc, xt.
#define HSUM4(ya, yb, yc, yd, xa, xt) \
	VHADDPS      yb, ya, ya; \
	VHADDPS      yd, yc, yc; \
	VHADDPS      yc, ya, ya; \
	VEXTRACTF128 $1, ya, xt; \
	VADDPS       xt, xa, xa

// G4ARGS loads the GEMM4 kernels' arguments: x rows SI, R10, R11, R13;
// W at DI, rows DX bytes apart (ws << wshift); CX = k; R8 the pairs; R14
// out.
#define G4ARGS(wshift) \
	MOVQ x+0(FP), SI; \
	MOVQ xs+8(FP), DX; \
	SHLQ $2, DX; \
	LEAQ (SI)(DX*1), R10; \
	LEAQ (SI)(DX*2), R11; \
	LEAQ (R10)(DX*2), R13; \
	MOVQ w+16(FP), DI; \
	MOVQ ws+24(FP), DX; \
	SHLQ $wshift, DX; \
	MOVQ k+32(FP), CX; \
	MOVQ pairs+40(FP), R8; \
	MOVQ out+48(FP), R14

// G4FMA multiplies the 8 columns at column off of the four x rows by the
// decoded W vectors wa, wb into Y(2t+r) (x row t, W row r).
#define G4FMA(off, wa, wb) \
	VFMADD231PS (off*4)(SI)(BX*4), wa, Y0; \
	VFMADD231PS (off*4)(SI)(BX*4), wb, Y1; \
	VFMADD231PS (off*4)(R10)(BX*4), wa, Y2; \
	VFMADD231PS (off*4)(R10)(BX*4), wb, Y3; \
	VFMADD231PS (off*4)(R11)(BX*4), wa, Y4; \
	VFMADD231PS (off*4)(R11)(BX*4), wb, Y5; \
	VFMADD231PS (off*4)(R13)(BX*4), wa, Y6; \
	VFMADD231PS (off*4)(R13)(BX*4), wb, Y7

// G4STORE reduces a GEMM4 pair's accumulators and stores its two sums of
// each x row at R14 + t*os, then steps R14 past them.
#define G4STORE \
	MOVQ os+56(FP), R12; \
	SHLQ $2, R12; \
	HSUM4(Y0, Y1, Y2, Y3, X0, X8); \
	HSUM4(Y4, Y5, Y6, Y7, X4, X8); \
	MOVQ R14, BX; \
	VMOVSD X0, (BX); \
	ADDQ R12, BX; \
	VMOVHPS X0, (BX); \
	ADDQ R12, BX; \
	VMOVSD X4, (BX); \
	ADDQ R12, BX; \
	VMOVHPS X4, (BX); \
	ADDQ $8, R14

// BF16Y loads 8 bf16 weights from mem and widens them into ymm y.
#define BF16Y(mem, y) \
	VPMOVZXWD mem, y; \
	VPSLLD    $16, y, y

// FP8Y loads 8 fp8 weights from mem and decodes them at 1/256 of their
// value into ymm y via its low half x: each byte sign-extended to a word,
// shifted left 7 and masked with 0xBF80 (in every word of X15) is the IEEE
// half of that value, which VCVTPH2PS widens (see kernels_amd64.s).
#define FP8Y(mem, x, y) \
	VPMOVSXBW mem, x; \
	VPSLLW    $7, x, x; \
	VPAND     X15, x, x; \
	VCVTPH2PS x, y

// FP8MASKY puts FP8Y's mask 0xBF80 in every word of Y15 (and so of X15).
// Clobbers AX.
#define FP8MASKY \
	MOVL         $0xBF80, AX; \
	MOVD         AX, X15; \
	VPBROADCASTW X15, Y15

// ROWS2x4 loads the 2x4 kernels' arguments: x rows SI, R9 (stride xs
// floats); w rows DI, R12, R13, R8 (stride ws elements of 1<<wshift bytes);
// CX = k. Clobbers BX, DX.
#define ROWS2x4(wshift) \
	MOVQ x+0(FP), SI; \
	MOVQ xs+8(FP), BX; \
	MOVQ w+16(FP), DI; \
	MOVQ ws+24(FP), DX; \
	MOVQ k+32(FP), CX; \
	SHLQ $2, BX; \
	SHLQ $wshift, DX; \
	LEAQ (SI)(BX*1), R9; \
	LEAQ (DI)(DX*1), R12; \
	LEAQ (DI)(DX*2), R13; \
	LEAQ (R12)(DX*2), R8

// ROWS1x4 loads the 1x4 kernels' arguments: x row SI; w rows DI, R9,
// R10, R11; CX = k. Clobbers DX.
#define ROWS1x4(wshift) \
	MOVQ x+0(FP), SI; \
	MOVQ w+8(FP), DI; \
	MOVQ ws+16(FP), DX; \
	MOVQ k+24(FP), CX; \
	SHLQ $wshift, DX; \
	LEAQ (DI)(DX*1), R9; \
	LEAQ (DI)(DX*2), R10; \
	LEAQ (R9)(DX*2), R11

#define ZERO8Y \
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7

// F24FMA multiplies x rows Y8, Y9 by W rows Y10-Y13 into Y(4t+r).
#define F24FMA \
	VFMADD231PS Y10, Y8, Y0; VFMADD231PS Y10, Y9, Y4; \
	VFMADD231PS Y11, Y8, Y1; VFMADD231PS Y11, Y9, Y5; \
	VFMADD231PS Y12, Y8, Y2; VFMADD231PS Y12, Y9, Y6; \
	VFMADD231PS Y13, Y8, Y3; VFMADD231PS Y13, Y9, Y7

// F14FMA multiplies x row Y8 by W rows Y10-Y13 into Y0-Y3.
#define F14FMA \
	VFMADD231PS Y10, Y8, Y0; VFMADD231PS Y11, Y8, Y1; \
	VFMADD231PS Y12, Y8, Y2; VFMADD231PS Y13, Y8, Y3

// OUT2x4 reduces the accumulators of the 2x4 kernels and stores (op =
// STORE) or adds (op = ADD) row t's four sums at out + t*os.
#define OUT2x4(op) \
	MOVQ out+40(FP), DI; \
	MOVQ os+48(FP), DX; \
	SHLQ $2, DX; \
	HSUM4(Y0, Y1, Y2, Y3, X0, X1); \
	HSUM4(Y4, Y5, Y6, Y7, X4, X5); \
	op(X0, (DI)); \
	op(X4, (DI)(DX*1))

#define STORE(x, mem) VMOVUPS x, mem

// func bf16Dot2x4AVX2(x *float32, xs int, w *uint16, ws int, k int, out *float32, os int)
// out[t*os+r] = Σ_j x[t*xs+j] * bf16(w[r*ws+j]) for t < 2, r < 4; k % 8 == 0.
TEXT ·bf16Dot2x4AVX2(SB), NOSPLIT, $0-56
	ROWS2x4(1)
	ZERO8Y
	XORQ BX, BX

b24loop:
	VMOVUPS (SI)(BX*4), Y8
	VMOVUPS (R9)(BX*4), Y9
	BF16Y((DI)(BX*2), Y10)
	BF16Y((R12)(BX*2), Y11)
	BF16Y((R13)(BX*2), Y12)
	BF16Y((R8)(BX*2), Y13)
	F24FMA
	ADDQ    $8, BX
	CMPQ    BX, CX
	JB      b24loop
	OUT2x4(STORE)
	VZEROUPPER
	RET

// func fp8Dot2x4AVX2(x *float32, xs int, w *uint8, ws int, k int, out *float32, os int)
// out[t*os+r] = Σ_j x[t*xs+j] * fp8(w[r*ws+j]) / 256 for t < 2, r < 4; k % 8 == 0.
TEXT ·fp8Dot2x4AVX2(SB), NOSPLIT, $0-56
	ROWS2x4(0)
	FP8MASKY
	ZERO8Y
	XORQ BX, BX

e24loop:
	VMOVUPS (SI)(BX*4), Y8
	VMOVUPS (R9)(BX*4), Y9
	FP8Y((DI)(BX*1), X10, Y10)
	FP8Y((R12)(BX*1), X11, Y11)
	FP8Y((R13)(BX*1), X12, Y12)
	FP8Y((R8)(BX*1), X13, Y13)
	F24FMA
	ADDQ    $8, BX
	CMPQ    BX, CX
	JB      e24loop
	OUT2x4(STORE)
	VZEROUPPER
	RET

// The GEMV kernels compute single-token (decode) products over many quads
// of W rows in one call, and the GEMM2 kernels the same for two x rows,
// decoding each W vector once for both. Both take 16 columns per step and
// prefetch W pf bytes ahead of the quad, as much per step as the quad
// consumes (as the AVX-512 GEMV kernels do; into L2 only when far is set).
// Registers: x SI (and R13); W rows DI, R9, R10, R11 of DX bytes; the
// prefetch pointer R12; BX the column; AX = k&^15; CX = k; R8 the quads
// left; R14 the outputs. A quad with ws = 0 computes one row four times,
// which is how the wrappers sum rows past the last quad in the same order.

// F32GVSTEP is one 16-column step of a f32 GEMV quad, prefetching with PF.
#define F32GVSTEP(PF) \
	PF 0(R12); \
	PF 64(R12); \
	PF 128(R12); \
	PF 192(R12); \
	ADDQ $256, R12; \
	VMOVUPS 0(SI)(BX*4), Y8; \
	VFMADD231PS 0(DI)(BX*4), Y8, Y0; \
	VFMADD231PS 0(R9)(BX*4), Y8, Y1; \
	VFMADD231PS 0(R10)(BX*4), Y8, Y2; \
	VFMADD231PS 0(R11)(BX*4), Y8, Y3; \
	VMOVUPS 32(SI)(BX*4), Y9; \
	VFMADD231PS 32(DI)(BX*4), Y9, Y0; \
	VFMADD231PS 32(R9)(BX*4), Y9, Y1; \
	VFMADD231PS 32(R10)(BX*4), Y9, Y2; \
	VFMADD231PS 32(R11)(BX*4), Y9, Y3

// F32G2STEP is one 16-column step of a f32 GEMM2 quad, prefetching with PF.
#define F32G2STEP(PF) \
	PF 0(R12); \
	PF 64(R12); \
	PF 128(R12); \
	PF 192(R12); \
	ADDQ $256, R12; \
	VMOVUPS 0(SI)(BX*4), Y8; \
	VMOVUPS 0(R13)(BX*4), Y9; \
	VMOVUPS 0(DI)(BX*4), Y10; \
	VMOVUPS 0(R9)(BX*4), Y11; \
	VMOVUPS 0(R10)(BX*4), Y12; \
	VMOVUPS 0(R11)(BX*4), Y13; \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y10, Y9, Y4; \
	VFMADD231PS Y11, Y8, Y1; \
	VFMADD231PS Y11, Y9, Y5; \
	VFMADD231PS Y12, Y8, Y2; \
	VFMADD231PS Y12, Y9, Y6; \
	VFMADD231PS Y13, Y8, Y3; \
	VFMADD231PS Y13, Y9, Y7; \
	VMOVUPS 32(SI)(BX*4), Y8; \
	VMOVUPS 32(R13)(BX*4), Y9; \
	VMOVUPS 32(DI)(BX*4), Y10; \
	VMOVUPS 32(R9)(BX*4), Y11; \
	VMOVUPS 32(R10)(BX*4), Y12; \
	VMOVUPS 32(R11)(BX*4), Y13; \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y10, Y9, Y4; \
	VFMADD231PS Y11, Y8, Y1; \
	VFMADD231PS Y11, Y9, Y5; \
	VFMADD231PS Y12, Y8, Y2; \
	VFMADD231PS Y12, Y9, Y6; \
	VFMADD231PS Y13, Y8, Y3; \
	VFMADD231PS Y13, Y9, Y7

// BF16GVSTEP is one 16-column step of a bf16 GEMV quad, prefetching with PF.
#define BF16GVSTEP(PF) \
	PF 0(R12); \
	PF 64(R12); \
	ADDQ $128, R12; \
	VMOVUPS 0(SI)(BX*4), Y8; \
	VPMOVZXWD 0(DI)(BX*2), Y10; \
	VPSLLD $16, Y10, Y10; \
	VPMOVZXWD 0(R9)(BX*2), Y11; \
	VPSLLD $16, Y11, Y11; \
	VPMOVZXWD 0(R10)(BX*2), Y12; \
	VPSLLD $16, Y12, Y12; \
	VPMOVZXWD 0(R11)(BX*2), Y13; \
	VPSLLD $16, Y13, Y13; \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y11, Y8, Y1; \
	VFMADD231PS Y12, Y8, Y2; \
	VFMADD231PS Y13, Y8, Y3; \
	VMOVUPS 32(SI)(BX*4), Y9; \
	VPMOVZXWD 16(DI)(BX*2), Y4; \
	VPSLLD $16, Y4, Y4; \
	VPMOVZXWD 16(R9)(BX*2), Y5; \
	VPSLLD $16, Y5, Y5; \
	VPMOVZXWD 16(R10)(BX*2), Y6; \
	VPSLLD $16, Y6, Y6; \
	VPMOVZXWD 16(R11)(BX*2), Y7; \
	VPSLLD $16, Y7, Y7; \
	VFMADD231PS Y4, Y9, Y0; \
	VFMADD231PS Y5, Y9, Y1; \
	VFMADD231PS Y6, Y9, Y2; \
	VFMADD231PS Y7, Y9, Y3

// BF16G2STEP is one 16-column step of a bf16 GEMM2 quad, prefetching with PF.
#define BF16G2STEP(PF) \
	PF 0(R12); \
	PF 64(R12); \
	ADDQ $128, R12; \
	VMOVUPS 0(SI)(BX*4), Y8; \
	VMOVUPS 0(R13)(BX*4), Y9; \
	VPMOVZXWD 0(DI)(BX*2), Y10; \
	VPSLLD $16, Y10, Y10; \
	VPMOVZXWD 0(R9)(BX*2), Y11; \
	VPSLLD $16, Y11, Y11; \
	VPMOVZXWD 0(R10)(BX*2), Y12; \
	VPSLLD $16, Y12, Y12; \
	VPMOVZXWD 0(R11)(BX*2), Y13; \
	VPSLLD $16, Y13, Y13; \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y10, Y9, Y4; \
	VFMADD231PS Y11, Y8, Y1; \
	VFMADD231PS Y11, Y9, Y5; \
	VFMADD231PS Y12, Y8, Y2; \
	VFMADD231PS Y12, Y9, Y6; \
	VFMADD231PS Y13, Y8, Y3; \
	VFMADD231PS Y13, Y9, Y7; \
	VMOVUPS 32(SI)(BX*4), Y8; \
	VMOVUPS 32(R13)(BX*4), Y9; \
	VPMOVZXWD 16(DI)(BX*2), Y10; \
	VPSLLD $16, Y10, Y10; \
	VPMOVZXWD 16(R9)(BX*2), Y11; \
	VPSLLD $16, Y11, Y11; \
	VPMOVZXWD 16(R10)(BX*2), Y12; \
	VPSLLD $16, Y12, Y12; \
	VPMOVZXWD 16(R11)(BX*2), Y13; \
	VPSLLD $16, Y13, Y13; \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y10, Y9, Y4; \
	VFMADD231PS Y11, Y8, Y1; \
	VFMADD231PS Y11, Y9, Y5; \
	VFMADD231PS Y12, Y8, Y2; \
	VFMADD231PS Y12, Y9, Y6; \
	VFMADD231PS Y13, Y8, Y3; \
	VFMADD231PS Y13, Y9, Y7

// FP8W16 loads the 16 fp8 weights at column BX of the row at base and
// decodes them as FP8Y does into ymm lo (columns 0..7) and hi (8..15),
// whose low halves are xlo and xhi: one widening for all 16 bytes.
#define FP8W16(base, xlo, lo, xhi, hi) \
	VPMOVSXBW    0(base)(BX*1), lo; \
	VPSLLW       $7, lo, lo; \
	VPAND        Y15, lo, lo; \
	VEXTRACTI128 $1, lo, xhi; \
	VCVTPH2PS    xlo, lo; \
	VCVTPH2PS    xhi, hi

// FP8GVSTEP is one 16-column step of a fp8 GEMV quad, prefetching with PF.
// Each accumulator takes columns 0..7 before 8..15, as in the other steps.
#define FP8GVSTEP(PF) \
	PF 0(R12); \
	ADDQ $64, R12; \
	VMOVUPS 0(SI)(BX*4), Y8; \
	VMOVUPS 32(SI)(BX*4), Y9; \
	FP8W16(DI, X4, Y4, X10, Y10); \
	FP8W16(R9, X5, Y5, X11, Y11); \
	FP8W16(R10, X6, Y6, X12, Y12); \
	FP8W16(R11, X7, Y7, X13, Y13); \
	VFMADD231PS Y4, Y8, Y0; \
	VFMADD231PS Y5, Y8, Y1; \
	VFMADD231PS Y6, Y8, Y2; \
	VFMADD231PS Y7, Y8, Y3; \
	VFMADD231PS Y10, Y9, Y0; \
	VFMADD231PS Y11, Y9, Y1; \
	VFMADD231PS Y12, Y9, Y2; \
	VFMADD231PS Y13, Y9, Y3

// FP8G2ROW decodes the 16 columns at BX of the W row at base and adds them into the
// accumulators a (x0) and b (x1): x0 and x1's columns 0..7 are in Y8 and
// Y9, their columns 8..15 in Y12 and Y13. Clobbers Y10, Y11.
#define FP8G2ROW(base, a, b) \
	FP8W16(base, X11, Y11, X10, Y10); \
	VFMADD231PS Y11, Y8, a; \
	VFMADD231PS Y11, Y9, b; \
	VFMADD231PS Y10, Y12, a; \
	VFMADD231PS Y10, Y13, b

// FP8G2STEP is one 16-column step of a fp8 GEMM2 quad, prefetching with PF.
#define FP8G2STEP(PF) \
	PF 0(R12); \
	ADDQ $64, R12; \
	VMOVUPS 0(SI)(BX*4), Y8; \
	VMOVUPS 0(R13)(BX*4), Y9; \
	VMOVUPS 32(SI)(BX*4), Y12; \
	VMOVUPS 32(R13)(BX*4), Y13; \
	FP8G2ROW(DI, Y0, Y4); \
	FP8G2ROW(R9, Y1, Y5); \
	FP8G2ROW(R10, Y2, Y6); \
	FP8G2ROW(R11, Y3, Y7)

// func f32GemvAVX2(x *float32, w *float32, ws int, k int, quads int, out *float32, pf int, far bool)
// out[r] = Σ_j x[j] * W[r][j] (raw for FP8) for r < 4*quads; k % 8 == 0.
TEXT ·f32GemvAVX2(SB), NOSPLIT, $0-57
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ ws+16(FP), DX
	SHLQ $2, DX
	MOVQ k+24(FP), CX
	MOVQ quads+32(FP), R8
	MOVQ out+40(FP), R14
	MOVQ CX, AX
	ANDQ $-16, AX
fgvquad:
	LEAQ (DI)(DX*1), R9
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ BX, BX
	MOVQ pf+48(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE fgvone
	CMPB far+56(FP), $0
	JNE fgvloop1
fgvloop0:
	F32GVSTEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fgvloop0
	JMP fgvone
fgvloop1:
	F32GVSTEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fgvloop1
fgvone:
	CMPQ BX, CX
	JAE fgvstore
	VMOVUPS 0(SI)(BX*4), Y8
	VFMADD231PS 0(DI)(BX*4), Y8, Y0
	VFMADD231PS 0(R9)(BX*4), Y8, Y1
	VFMADD231PS 0(R10)(BX*4), Y8, Y2
	VFMADD231PS 0(R11)(BX*4), Y8, Y3
fgvstore:
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	VMOVUPS X0, (R14)
	ADDQ $16, R14
	LEAQ (DI)(DX*4), DI
	DECQ R8
	JNZ fgvquad
	VZEROUPPER
	RET

// func f32Gemm2AVX2(x0, x1 *float32, w *float32, ws, k, quads int, out *float32, os, pf int, far bool)
// out[t*os+r] = Σ_j x_t[j] * W[r][j] (raw for FP8) for t < 2, r < 4*quads; k % 8 == 0.
TEXT ·f32Gemm2AVX2(SB), NOSPLIT, $0-73
	MOVQ x0+0(FP), SI
	MOVQ x1+8(FP), R13
	MOVQ w+16(FP), DI
	MOVQ ws+24(FP), DX
	SHLQ $2, DX
	MOVQ k+32(FP), CX
	MOVQ quads+40(FP), R8
	MOVQ out+48(FP), R14
	MOVQ CX, AX
	ANDQ $-16, AX
fg2quad:
	LEAQ (DI)(DX*1), R9
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	ZERO8Y
	XORQ BX, BX
	MOVQ pf+64(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE fg2one
	CMPB far+72(FP), $0
	JNE fg2loop1
fg2loop0:
	F32G2STEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fg2loop0
	JMP fg2one
fg2loop1:
	F32G2STEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fg2loop1
fg2one:
	CMPQ BX, CX
	JAE fg2store
	VMOVUPS 0(SI)(BX*4), Y8
	VMOVUPS 0(R13)(BX*4), Y9
	VMOVUPS 0(DI)(BX*4), Y10
	VMOVUPS 0(R9)(BX*4), Y11
	VMOVUPS 0(R10)(BX*4), Y12
	VMOVUPS 0(R11)(BX*4), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
fg2store:
	MOVQ os+56(FP), R12
	SHLQ $2, R12
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	HSUM4(Y4, Y5, Y6, Y7, X4, X5)
	VMOVUPS X0, (R14)
	VMOVUPS X4, (R14)(R12*1)
	ADDQ $16, R14
	LEAQ (DI)(DX*4), DI
	DECQ R8
	JNZ fg2quad
	VZEROUPPER
	RET

// func bf16GemvAVX2(x *float32, w *uint16, ws int, k int, quads int, out *float32, pf int, far bool)
// out[r] = Σ_j x[j] * W[r][j] (raw for FP8) for r < 4*quads; k % 8 == 0.
TEXT ·bf16GemvAVX2(SB), NOSPLIT, $0-57
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ ws+16(FP), DX
	SHLQ $1, DX
	MOVQ k+24(FP), CX
	MOVQ quads+32(FP), R8
	MOVQ out+40(FP), R14
	MOVQ CX, AX
	ANDQ $-16, AX
bgvquad:
	LEAQ (DI)(DX*1), R9
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ BX, BX
	MOVQ pf+48(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE bgvone
	CMPB far+56(FP), $0
	JNE bgvloop1
bgvloop0:
	BF16GVSTEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB bgvloop0
	JMP bgvone
bgvloop1:
	BF16GVSTEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB bgvloop1
bgvone:
	CMPQ BX, CX
	JAE bgvstore
	VMOVUPS 0(SI)(BX*4), Y8
	VPMOVZXWD 0(DI)(BX*2), Y10
	VPSLLD $16, Y10, Y10
	VPMOVZXWD 0(R9)(BX*2), Y11
	VPSLLD $16, Y11, Y11
	VPMOVZXWD 0(R10)(BX*2), Y12
	VPSLLD $16, Y12, Y12
	VPMOVZXWD 0(R11)(BX*2), Y13
	VPSLLD $16, Y13, Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y13, Y8, Y3
bgvstore:
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	VMOVUPS X0, (R14)
	ADDQ $16, R14
	LEAQ (DI)(DX*4), DI
	DECQ R8
	JNZ bgvquad
	VZEROUPPER
	RET

// func bf16Gemm2AVX2(x0, x1 *float32, w *uint16, ws, k, quads int, out *float32, os, pf int, far bool)
// out[t*os+r] = Σ_j x_t[j] * W[r][j] (raw for FP8) for t < 2, r < 4*quads; k % 8 == 0.
TEXT ·bf16Gemm2AVX2(SB), NOSPLIT, $0-73
	MOVQ x0+0(FP), SI
	MOVQ x1+8(FP), R13
	MOVQ w+16(FP), DI
	MOVQ ws+24(FP), DX
	SHLQ $1, DX
	MOVQ k+32(FP), CX
	MOVQ quads+40(FP), R8
	MOVQ out+48(FP), R14
	MOVQ CX, AX
	ANDQ $-16, AX
bg2quad:
	LEAQ (DI)(DX*1), R9
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	ZERO8Y
	XORQ BX, BX
	MOVQ pf+64(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE bg2one
	CMPB far+72(FP), $0
	JNE bg2loop1
bg2loop0:
	BF16G2STEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB bg2loop0
	JMP bg2one
bg2loop1:
	BF16G2STEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB bg2loop1
bg2one:
	CMPQ BX, CX
	JAE bg2store
	VMOVUPS 0(SI)(BX*4), Y8
	VMOVUPS 0(R13)(BX*4), Y9
	VPMOVZXWD 0(DI)(BX*2), Y10
	VPSLLD $16, Y10, Y10
	VPMOVZXWD 0(R9)(BX*2), Y11
	VPSLLD $16, Y11, Y11
	VPMOVZXWD 0(R10)(BX*2), Y12
	VPSLLD $16, Y12, Y12
	VPMOVZXWD 0(R11)(BX*2), Y13
	VPSLLD $16, Y13, Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
bg2store:
	MOVQ os+56(FP), R12
	SHLQ $2, R12
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	HSUM4(Y4, Y5, Y6, Y7, X4, X5)
	VMOVUPS X0, (R14)
	VMOVUPS X4, (R14)(R12*1)
	ADDQ $16, R14
	LEAQ (DI)(DX*4), DI
	DECQ R8
	JNZ bg2quad
	VZEROUPPER
	RET

// func fp8GemvAVX2(x *float32, w *uint8, ws int, k int, quads int, out *float32, pf int, far bool)
// out[r] = Σ_j x[j] * W[r][j] (raw for FP8) for r < 4*quads; k % 8 == 0.
TEXT ·fp8GemvAVX2(SB), NOSPLIT, $0-57
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ ws+16(FP), DX
	SHLQ $0, DX
	MOVQ k+24(FP), CX
	MOVQ quads+32(FP), R8
	MOVQ out+40(FP), R14
	FP8MASKY
	MOVQ CX, AX
	ANDQ $-16, AX
fgvquad:
	LEAQ (DI)(DX*1), R9
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ BX, BX
	MOVQ pf+48(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE fgvone
	CMPB far+56(FP), $0
	JNE fgvloop1
fgvloop0:
	FP8GVSTEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fgvloop0
	JMP fgvone
fgvloop1:
	FP8GVSTEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fgvloop1
fgvone:
	CMPQ BX, CX
	JAE fgvstore
	VMOVUPS 0(SI)(BX*4), Y8
	FP8Y(0(DI)(BX*1), X10, Y10)
	FP8Y(0(R9)(BX*1), X11, Y11)
	FP8Y(0(R10)(BX*1), X12, Y12)
	FP8Y(0(R11)(BX*1), X13, Y13)
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y13, Y8, Y3
fgvstore:
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	VMOVUPS X0, (R14)
	ADDQ $16, R14
	LEAQ (DI)(DX*4), DI
	DECQ R8
	JNZ fgvquad
	VZEROUPPER
	RET

// func fp8Gemm2AVX2(x0, x1 *float32, w *uint8, ws, k, quads int, out *float32, os, pf int, far bool)
// out[t*os+r] = Σ_j x_t[j] * W[r][j] (raw for FP8) for t < 2, r < 4*quads; k % 8 == 0.
TEXT ·fp8Gemm2AVX2(SB), NOSPLIT, $0-73
	MOVQ x0+0(FP), SI
	MOVQ x1+8(FP), R13
	MOVQ w+16(FP), DI
	MOVQ ws+24(FP), DX
	SHLQ $0, DX
	MOVQ k+32(FP), CX
	MOVQ quads+40(FP), R8
	MOVQ out+48(FP), R14
	FP8MASKY
	MOVQ CX, AX
	ANDQ $-16, AX
fg2quad:
	LEAQ (DI)(DX*1), R9
	LEAQ (DI)(DX*2), R10
	LEAQ (R9)(DX*2), R11
	ZERO8Y
	XORQ BX, BX
	MOVQ pf+64(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE fg2one
	CMPB far+72(FP), $0
	JNE fg2loop1
fg2loop0:
	FP8G2STEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fg2loop0
	JMP fg2one
fg2loop1:
	FP8G2STEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fg2loop1
fg2one:
	CMPQ BX, CX
	JAE fg2store
	VMOVUPS 0(SI)(BX*4), Y8
	VMOVUPS 0(R13)(BX*4), Y9
	FP8Y(0(DI)(BX*1), X10, Y10)
	FP8Y(0(R9)(BX*1), X11, Y11)
	FP8Y(0(R10)(BX*1), X12, Y12)
	FP8Y(0(R11)(BX*1), X13, Y13)
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
fg2store:
	MOVQ os+56(FP), R12
	SHLQ $2, R12
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	HSUM4(Y4, Y5, Y6, Y7, X4, X5)
	VMOVUPS X0, (R14)
	VMOVUPS X4, (R14)(R12*1)
	ADDQ $16, R14
	LEAQ (DI)(DX*4), DI
	DECQ R8
	JNZ fg2quad
	VZEROUPPER
	RET

// FP8G4BLOCK decodes the 8 columns at column off of W rows DI and R9 into
// wa and wb and multiplies them by the four x rows (G4FMA).
#define FP8G4BLOCK(off, xa, wa, xb, wb) \
	FP8Y(off(DI)(BX*1), xa, wa); \
	FP8Y(off(R9)(BX*1), xb, wb); \
	G4FMA(off, wa, wb)

// FP8G4STEP is one 16-column step of a fp8 GEMM4 pair, prefetching with PF.
#define FP8G4STEP(PF) \
	PF 0(R12); \
	ADDQ $32, R12; \
	FP8G4BLOCK(0, X8, Y8, X9, Y9); \
	FP8G4BLOCK(8, X10, Y10, X11, Y11)

// func fp8Gemm4AVX2(x *float32, xs int, w *uint8, ws, k, pairs int, out *float32, os, pf int, far bool)
// out[t*os+r] = Σ_j x[t*xs+j] * W[r][j] (raw) for t < 4, r < 2*pairs;
// k % 8 == 0: four x rows against pairs of W rows, each W vector decoded
// once for all four (GEMM2 decodes it for two), x read from L1 as the
// FMAs' memory operands. A pair with ws = 0 computes one row twice.
TEXT ·fp8Gemm4AVX2(SB), NOSPLIT, $0-73
	G4ARGS(0)
	FP8MASKY
	MOVQ CX, AX
	ANDQ $-16, AX
fg4pair:
	LEAQ (DI)(DX*1), R9
	ZERO8Y
	XORQ BX, BX
	MOVQ pf+64(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE fg4one
	CMPB far+72(FP), $0
	JNE fg4loop1
fg4loop0:
	FP8G4STEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fg4loop0
	JMP fg4one
fg4loop1:
	FP8G4STEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB fg4loop1
fg4one:
	CMPQ BX, CX
	JAE fg4store
	FP8G4BLOCK(0, X8, Y8, X9, Y9)
fg4store:
	G4STORE
	LEAQ (DI)(DX*2), DI
	DECQ R8
	JNZ fg4pair
	VZEROUPPER
	RET

// BF16G4BLOCK is FP8G4BLOCK for BF16 weights, at column off.
#define BF16G4BLOCK(off, wa, wb) \
	BF16Y((off*2)(DI)(BX*2), wa); \
	BF16Y((off*2)(R9)(BX*2), wb); \
	G4FMA(off, wa, wb)

// BF16G4STEP is one 16-column step of a bf16 GEMM4 pair, prefetching with PF.
#define BF16G4STEP(PF) \
	PF 0(R12); \
	ADDQ $64, R12; \
	BF16G4BLOCK(0, Y8, Y9); \
	BF16G4BLOCK(8, Y10, Y11)

// func bf16Gemm4AVX2(x *float32, xs int, w *uint16, ws, k, pairs int, out *float32, os, pf int, far bool)
// fp8Gemm4AVX2 for BF16 weights.
TEXT ·bf16Gemm4AVX2(SB), NOSPLIT, $0-73
	G4ARGS(1)
	MOVQ CX, AX
	ANDQ $-16, AX
bg4pair:
	LEAQ (DI)(DX*1), R9
	ZERO8Y
	XORQ BX, BX
	MOVQ pf+64(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE bg4one
	CMPB far+72(FP), $0
	JNE bg4loop1
bg4loop0:
	BF16G4STEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB bg4loop0
	JMP bg4one
bg4loop1:
	BF16G4STEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB bg4loop1
bg4one:
	CMPQ BX, CX
	JAE bg4store
	BF16G4BLOCK(0, Y8, Y9)
bg4store:
	G4STORE
	LEAQ (DI)(DX*2), DI
	DECQ R8
	JNZ bg4pair
	VZEROUPPER
	RET

// F32G4BLOCK is FP8G4BLOCK for F32 weights, at column off.
#define F32G4BLOCK(off, wa, wb) \
	VMOVUPS (off*4)(DI)(BX*4), wa; \
	VMOVUPS (off*4)(R9)(BX*4), wb; \
	G4FMA(off, wa, wb)

// F32G4STEP is one 16-column step of a f32 GEMM4 pair, prefetching with PF.
#define F32G4STEP(PF) \
	PF 0(R12); \
	PF 64(R12); \
	ADDQ $128, R12; \
	F32G4BLOCK(0, Y8, Y9); \
	F32G4BLOCK(8, Y10, Y11)

// func f32Gemm4AVX2(x *float32, xs int, w *float32, ws, k, pairs int, out *float32, os, pf int, far bool)
// fp8Gemm4AVX2 for F32 weights.
TEXT ·f32Gemm4AVX2(SB), NOSPLIT, $0-73
	G4ARGS(2)
	MOVQ CX, AX
	ANDQ $-16, AX
f4gpair:
	LEAQ (DI)(DX*1), R9
	ZERO8Y
	XORQ BX, BX
	MOVQ pf+64(FP), R12
	ADDQ DI, R12
	CMPQ BX, AX
	JAE f4gone
	CMPB far+72(FP), $0
	JNE f4gloop1
f4gloop0:
	F32G4STEP(PREFETCHT0)
	ADDQ $16, BX
	CMPQ BX, AX
	JB f4gloop0
	JMP f4gone
f4gloop1:
	F32G4STEP(PREFETCHT1)
	ADDQ $16, BX
	CMPQ BX, AX
	JB f4gloop1
f4gone:
	CMPQ BX, CX
	JAE f4gstore
	F32G4BLOCK(0, Y8, Y9)
f4gstore:
	G4STORE
	LEAQ (DI)(DX*2), DI
	DECQ R8
	JNZ f4gpair
	VZEROUPPER
	RET

// func f32TileRunAVX2(x *float32, xs, pairs int, w *float32, ws, k int, out *float32, os int)
// out[t*os+r] = Σ_j x[t*xs+j] * w[r*ws+j] for t < 2*pairs, r < 4; k % 8 == 0:
// the 2x4 tiles of a run of x row pairs against one quad of W rows, which
// stays in L1 while the pairs stream past, in one call.
TEXT ·f32TileRunAVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ xs+8(FP), R14
	SHLQ $2, R14
	LEAQ (SI)(R14*1), R9
	SHLQ $1, R14
	MOVQ w+24(FP), DI
	MOVQ ws+32(FP), DX
	SHLQ $2, DX
	LEAQ (DI)(DX*1), R12
	LEAQ (DI)(DX*2), R13
	LEAQ (R12)(DX*2), R8
	MOVQ k+40(FP), CX
	MOVQ CX, AX
	ANDQ $-16, AX
	MOVQ out+48(FP), R10
	MOVQ os+56(FP), R11
	SHLQ $2, R11
	MOVQ pairs+16(FP), DX
trpair:
	ZERO8Y
	XORQ BX, BX
	CMPQ BX, AX
	JAE trone
trloop:
	VMOVUPS 0(SI)(BX*4), Y8
	VMOVUPS 0(R9)(BX*4), Y9
	VMOVUPS 0(DI)(BX*4), Y10
	VMOVUPS 0(R12)(BX*4), Y11
	VMOVUPS 0(R13)(BX*4), Y12
	VMOVUPS 0(R8)(BX*4), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	VMOVUPS 32(SI)(BX*4), Y8
	VMOVUPS 32(R9)(BX*4), Y9
	VMOVUPS 32(DI)(BX*4), Y10
	VMOVUPS 32(R12)(BX*4), Y11
	VMOVUPS 32(R13)(BX*4), Y12
	VMOVUPS 32(R8)(BX*4), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ $16, BX
	CMPQ BX, AX
	JB trloop
trone:
	CMPQ BX, CX
	JAE trstore
	VMOVUPS 0(SI)(BX*4), Y8
	VMOVUPS 0(R9)(BX*4), Y9
	VMOVUPS 0(DI)(BX*4), Y10
	VMOVUPS 0(R12)(BX*4), Y11
	VMOVUPS 0(R13)(BX*4), Y12
	VMOVUPS 0(R8)(BX*4), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
trstore:
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	HSUM4(Y4, Y5, Y6, Y7, X4, X5)
	VMOVUPS X0, (R10)
	VMOVUPS X4, (R10)(R11*1)
	LEAQ (R10)(R11*2), R10
	ADDQ R14, SI
	ADDQ R14, R9
	DECQ DX
	JNZ trpair
	VZEROUPPER
	RET

// TILE4x3STEP is 8 columns, at byte offset off from column BX, of a 4x3
// tile: x rows SI, R9, R10, R11 against W rows DI, R12, R13 into the
// accumulators Y0..Y11 (x row t, W row r in Y(3t+r)). Clobbers Y12..Y15.
#define TILE4x3STEP(off) \
	VMOVUPS off(DI)(BX*4), Y12; \
	VMOVUPS off(R12)(BX*4), Y13; \
	VMOVUPS off(R13)(BX*4), Y14; \
	VMOVUPS off(SI)(BX*4), Y15; \
	VFMADD231PS Y12, Y15, Y0; \
	VFMADD231PS Y13, Y15, Y1; \
	VFMADD231PS Y14, Y15, Y2; \
	VMOVUPS off(R9)(BX*4), Y15; \
	VFMADD231PS Y12, Y15, Y3; \
	VFMADD231PS Y13, Y15, Y4; \
	VFMADD231PS Y14, Y15, Y5; \
	VMOVUPS off(R10)(BX*4), Y15; \
	VFMADD231PS Y12, Y15, Y6; \
	VFMADD231PS Y13, Y15, Y7; \
	VFMADD231PS Y14, Y15, Y8; \
	VMOVUPS off(R11)(BX*4), Y15; \
	VFMADD231PS Y12, Y15, Y9; \
	VFMADD231PS Y13, Y15, Y10; \
	VFMADD231PS Y14, Y15, Y11

// ZERO12Y clears the 4x3 tile accumulators Y0..Y11.
#define ZERO12Y \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7; \
	VXORPS Y8, Y8, Y8; \
	VXORPS Y9, Y9, Y9; \
	VXORPS Y10, Y10, Y10; \
	VXORPS Y11, Y11, Y11

// HSUM4x3 sums the 4x3 tile accumulators, leaving x row t's three sums in
// lanes 0..2 of X0, X3, X6, X9. A third accumulator passed twice is
// summed by HSUM4's tree like the others.
#define HSUM4x3 \
	HSUM4(Y0, Y1, Y2, Y2, X0, X15); \
	HSUM4(Y3, Y4, Y5, Y5, X3, X15); \
	HSUM4(Y6, Y7, Y8, Y8, X6, X15); \
	HSUM4(Y9, Y10, Y11, Y11, X9, X15)

// func f32Tile4x3RunAVX2(x *float32, xs, quads int, w *float32, ws, k int, out *float32, os int)
// out[t*os+r] = Σ_j x[t*xs+j] * w[r*ws+j] for t < 4*quads, r < 3; k % 8 == 0:
// 4x3 tiles of a run of x row quads against three W rows, which stay in
// L1 while the quads stream past. Twelve accumulators leave the FMA units
// slack that the eight of a 2x4 tile do not.
TEXT ·f32Tile4x3RunAVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ xs+8(FP), R14
	SHLQ $2, R14
	LEAQ (SI)(R14*1), R9
	LEAQ (SI)(R14*2), R10
	LEAQ (R9)(R14*2), R11
	SHLQ $2, R14
	MOVQ w+24(FP), DI
	MOVQ ws+32(FP), DX
	SHLQ $2, DX
	LEAQ (DI)(DX*1), R12
	LEAQ (DI)(DX*2), R13
	MOVQ k+40(FP), CX
	MOVQ CX, AX
	ANDQ $-16, AX
	MOVQ out+48(FP), R8
	MOVQ os+56(FP), DX
	SHLQ $2, DX
t3quad:
	ZERO12Y
	XORQ BX, BX
	CMPQ BX, AX
	JAE t3one
t3loop:
	TILE4x3STEP(0)
	TILE4x3STEP(32)
	ADDQ $16, BX
	CMPQ BX, AX
	JB t3loop
t3one:
	CMPQ BX, CX
	JAE t3store
	TILE4x3STEP(0)
t3store:
	HSUM4x3
	VMOVSD X0, (R8)
	VEXTRACTPS $2, X0, 8(R8)
	ADDQ DX, R8
	VMOVSD X3, (R8)
	VEXTRACTPS $2, X3, 8(R8)
	ADDQ DX, R8
	VMOVSD X6, (R8)
	VEXTRACTPS $2, X6, 8(R8)
	ADDQ DX, R8
	VMOVSD X9, (R8)
	VEXTRACTPS $2, X9, 8(R8)
	ADDQ DX, R8
	ADDQ R14, SI
	ADDQ R14, R9
	ADDQ R14, R10
	ADDQ R14, R11
	DECQ quads+16(FP)
	JNZ t3quad
	VZEROUPPER
	RET

// func f32Tile4x3ColsAVX2(x *float32, xs int, w *float32, ws, k, triples int, out *float32, os int)
// out[t*os+r] = Σ_j x[t*xs+j] * w[r*ws+j] for t < 4, r < 3*triples; k % 8 == 0:
// the 4x3 tiles of one quad of x rows, which stays in L1, against a run of
// W row triples streaming past it: the same tiles, and sums, as
// f32Tile4x3RunAVX2 with the loops the other way round.
TEXT ·f32Tile4x3ColsAVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ xs+8(FP), R14
	SHLQ $2, R14
	LEAQ (SI)(R14*1), R9
	LEAQ (SI)(R14*2), R10
	LEAQ (R9)(R14*2), R11
	MOVQ w+16(FP), DI
	MOVQ ws+24(FP), DX
	SHLQ $2, DX
	LEAQ (DI)(DX*1), R12
	LEAQ (DI)(DX*2), R13
	LEAQ (DX)(DX*2), R14
	MOVQ k+32(FP), CX
	MOVQ CX, AX
	ANDQ $-16, AX
	MOVQ out+48(FP), R8
	MOVQ os+56(FP), DX
	SHLQ $2, DX
t3ctriple:
	ZERO12Y
	XORQ BX, BX
	CMPQ BX, AX
	JAE t3cone
t3cloop:
	TILE4x3STEP(0)
	TILE4x3STEP(32)
	ADDQ $16, BX
	CMPQ BX, AX
	JB t3cloop
t3cone:
	CMPQ BX, CX
	JAE t3cstore
	TILE4x3STEP(0)
t3cstore:
	HSUM4x3
	MOVQ R8, BX
	VMOVSD X0, (BX)
	VEXTRACTPS $2, X0, 8(BX)
	ADDQ DX, BX
	VMOVSD X3, (BX)
	VEXTRACTPS $2, X3, 8(BX)
	ADDQ DX, BX
	VMOVSD X6, (BX)
	VEXTRACTPS $2, X6, 8(BX)
	ADDQ DX, BX
	VMOVSD X9, (BX)
	VEXTRACTPS $2, X9, 8(BX)
	ADDQ $12, R8
	ADDQ R14, DI
	ADDQ R14, R12
	ADDQ R14, R13
	DECQ triples+40(FP)
	JNZ t3ctriple
	VZEROUPPER
	RET

// func dotAVX2(a *float32, b *float32, n int) float32
// n % 8 == 0.
TEXT ·dotAVX2(SB), NOSPLIT, $0-28
	MOVQ   a+0(FP), SI
	MOVQ   b+8(FP), DI
	MOVQ   n+16(FP), CX
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3
	XORQ   BX, BX
	MOVQ   CX, AX
	ANDQ   $-32, AX
	JZ     dot8

dot32:
	VMOVUPS     (SI)(BX*4), Y4
	VMOVUPS     32(SI)(BX*4), Y5
	VMOVUPS     64(SI)(BX*4), Y6
	VMOVUPS     96(SI)(BX*4), Y7
	VFMADD231PS (DI)(BX*4), Y4, Y0
	VFMADD231PS 32(DI)(BX*4), Y5, Y1
	VFMADD231PS 64(DI)(BX*4), Y6, Y2
	VFMADD231PS 96(DI)(BX*4), Y7, Y3
	ADDQ        $32, BX
	CMPQ        BX, AX
	JB          dot32

dot8:
	CMPQ BX, CX
	JAE  dotreduce
	VMOVUPS     (SI)(BX*4), Y4
	VFMADD231PS (DI)(BX*4), Y4, Y0
	ADDQ        $8, BX
	JMP         dot8

dotreduce:
	VADDPS       Y1, Y0, Y0
	VADDPS       Y3, Y2, Y2
	VADDPS       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0
	VMOVSS       X0, ret+24(FP)
	VZEROUPPER
	RET

// func axpyAVX2(y *float32, alpha float32, x *float32, n int)
// y[j] += alpha * x[j]; n % 8 == 0.
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	VBROADCASTSS alpha+8(FP), Y15
	MOVQ         x+16(FP), SI
	MOVQ         n+24(FP), CX
	XORQ         BX, BX
	MOVQ         CX, AX
	ANDQ         $-32, AX
	JZ           ax8

ax32:
	VMOVUPS     (SI)(BX*4), Y0
	VMOVUPS     32(SI)(BX*4), Y1
	VMOVUPS     64(SI)(BX*4), Y2
	VMOVUPS     96(SI)(BX*4), Y3
	VFMADD213PS (DI)(BX*4), Y15, Y0
	VFMADD213PS 32(DI)(BX*4), Y15, Y1
	VFMADD213PS 64(DI)(BX*4), Y15, Y2
	VFMADD213PS 96(DI)(BX*4), Y15, Y3
	VMOVUPS     Y0, (DI)(BX*4)
	VMOVUPS     Y1, 32(DI)(BX*4)
	VMOVUPS     Y2, 64(DI)(BX*4)
	VMOVUPS     Y3, 96(DI)(BX*4)
	ADDQ        $32, BX
	CMPQ        BX, AX
	JB          ax32

ax8:
	CMPQ BX, CX
	JAE  axdone
	VMOVUPS     (SI)(BX*4), Y0
	VFMADD213PS (DI)(BX*4), Y15, Y0
	VMOVUPS     Y0, (DI)(BX*4)
	ADDQ        $8, BX
	JMP         ax8

axdone:
	VZEROUPPER
	RET

// func scaleAVX2(y *float32, alpha float32, n int)
// y[j] *= alpha; n % 8 == 0.
TEXT ·scaleAVX2(SB), NOSPLIT, $0-24
	MOVQ         y+0(FP), DI
	VBROADCASTSS alpha+8(FP), Y15
	MOVQ         n+16(FP), CX
	XORQ         BX, BX

sc8:
	CMPQ    BX, CX
	JAE     scdone
	VMULPS  (DI)(BX*4), Y15, Y0
	VMOVUPS Y0, (DI)(BX*4)
	ADDQ    $8, BX
	JMP     sc8

scdone:
	VZEROUPPER
	RET

// func bf16ToF32AVX2(dst *float32, src *uint16, n int)
// dst[j] = bf16(src[j]); n % 8 == 0.
TEXT ·bf16ToF32AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ BX, BX

b2floop:
	CMPQ    BX, CX
	JAE     b2fdone
	BF16Y((SI)(BX*2), Y0)
	VMOVUPS Y0, (DI)(BX*4)
	ADDQ    $8, BX
	JMP     b2floop

b2fdone:
	VZEROUPPER
	RET

// func fp8ToF32AVX2(dst *float32, src *uint8, n int, mul float32)
// dst[j] = fp8(src[j]) / 256 * mul; n % 8 == 0. 32 weights per step.
TEXT ·fp8ToF32AVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS mul+24(FP), Y14
	FP8MASKY
	XORQ         BX, BX
	MOVQ         CX, AX
	ANDQ         $-32, AX

e2f32:
	CMPQ    BX, AX
	JAE     e2floop
	FP8Y((SI)(BX*1), X0, Y0)
	FP8Y(8(SI)(BX*1), X1, Y1)
	FP8Y(16(SI)(BX*1), X2, Y2)
	FP8Y(24(SI)(BX*1), X3, Y3)
	VMULPS  Y14, Y0, Y0
	VMULPS  Y14, Y1, Y1
	VMULPS  Y14, Y2, Y2
	VMULPS  Y14, Y3, Y3
	VMOVUPS Y0, (DI)(BX*4)
	VMOVUPS Y1, 32(DI)(BX*4)
	VMOVUPS Y2, 64(DI)(BX*4)
	VMOVUPS Y3, 96(DI)(BX*4)
	ADDQ    $32, BX
	JMP     e2f32

e2floop:
	CMPQ    BX, CX
	JAE     e2fdone
	FP8Y((SI)(BX*1), X0, Y0)
	VMULPS  Y14, Y0, Y0
	VMOVUPS Y0, (DI)(BX*4)
	ADDQ    $8, BX
	JMP     e2floop

e2fdone:
	VZEROUPPER
	RET

// func fmaPeakAVX2(iters int)
// Runs 12 independent chains of VFMADD231PS, 12 per iteration: the FMA
// throughput the arithmetic-bound kernels are measured against.
TEXT ·fmaPeakAVX2(SB), NOSPLIT, $0-8
	MOVQ   iters+0(FP), CX
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11
	VXORPS Y14, Y14, Y14; VXORPS Y15, Y15, Y15

peakloop:
	VFMADD231PS Y14, Y15, Y0; VFMADD231PS Y14, Y15, Y1; VFMADD231PS Y14, Y15, Y2
	VFMADD231PS Y14, Y15, Y3; VFMADD231PS Y14, Y15, Y4; VFMADD231PS Y14, Y15, Y5
	VFMADD231PS Y14, Y15, Y6; VFMADD231PS Y14, Y15, Y7; VFMADD231PS Y14, Y15, Y8
	VFMADD231PS Y14, Y15, Y9; VFMADD231PS Y14, Y15, Y10; VFMADD231PS Y14, Y15, Y11
	DECQ        CX
	JNZ         peakloop
	VZEROUPPER
	RET
// expc holds the constants of EXPY, each in all 8 lanes: the clamps
// (88.376 and -87, so that 2^n stays a normal float), log2(e), ln 2 in
// two parts, the polynomial's coefficients and 1.
DATA expc<>+0(SB)/4, $0x42b0c0a5
DATA expc<>+4(SB)/4, $0x42b0c0a5
DATA expc<>+8(SB)/4, $0x42b0c0a5
DATA expc<>+12(SB)/4, $0x42b0c0a5
DATA expc<>+16(SB)/4, $0x42b0c0a5
DATA expc<>+20(SB)/4, $0x42b0c0a5
DATA expc<>+24(SB)/4, $0x42b0c0a5
DATA expc<>+28(SB)/4, $0x42b0c0a5
DATA expc<>+32(SB)/4, $0xc2ae0000
DATA expc<>+36(SB)/4, $0xc2ae0000
DATA expc<>+40(SB)/4, $0xc2ae0000
DATA expc<>+44(SB)/4, $0xc2ae0000
DATA expc<>+48(SB)/4, $0xc2ae0000
DATA expc<>+52(SB)/4, $0xc2ae0000
DATA expc<>+56(SB)/4, $0xc2ae0000
DATA expc<>+60(SB)/4, $0xc2ae0000
DATA expc<>+64(SB)/4, $0x3fb8aa3b
DATA expc<>+68(SB)/4, $0x3fb8aa3b
DATA expc<>+72(SB)/4, $0x3fb8aa3b
DATA expc<>+76(SB)/4, $0x3fb8aa3b
DATA expc<>+80(SB)/4, $0x3fb8aa3b
DATA expc<>+84(SB)/4, $0x3fb8aa3b
DATA expc<>+88(SB)/4, $0x3fb8aa3b
DATA expc<>+92(SB)/4, $0x3fb8aa3b
DATA expc<>+96(SB)/4, $0x3f318000
DATA expc<>+100(SB)/4, $0x3f318000
DATA expc<>+104(SB)/4, $0x3f318000
DATA expc<>+108(SB)/4, $0x3f318000
DATA expc<>+112(SB)/4, $0x3f318000
DATA expc<>+116(SB)/4, $0x3f318000
DATA expc<>+120(SB)/4, $0x3f318000
DATA expc<>+124(SB)/4, $0x3f318000
DATA expc<>+128(SB)/4, $0xb95e8083
DATA expc<>+132(SB)/4, $0xb95e8083
DATA expc<>+136(SB)/4, $0xb95e8083
DATA expc<>+140(SB)/4, $0xb95e8083
DATA expc<>+144(SB)/4, $0xb95e8083
DATA expc<>+148(SB)/4, $0xb95e8083
DATA expc<>+152(SB)/4, $0xb95e8083
DATA expc<>+156(SB)/4, $0xb95e8083
DATA expc<>+160(SB)/4, $0x39506967
DATA expc<>+164(SB)/4, $0x39506967
DATA expc<>+168(SB)/4, $0x39506967
DATA expc<>+172(SB)/4, $0x39506967
DATA expc<>+176(SB)/4, $0x39506967
DATA expc<>+180(SB)/4, $0x39506967
DATA expc<>+184(SB)/4, $0x39506967
DATA expc<>+188(SB)/4, $0x39506967
DATA expc<>+192(SB)/4, $0x3ab743ce
DATA expc<>+196(SB)/4, $0x3ab743ce
DATA expc<>+200(SB)/4, $0x3ab743ce
DATA expc<>+204(SB)/4, $0x3ab743ce
DATA expc<>+208(SB)/4, $0x3ab743ce
DATA expc<>+212(SB)/4, $0x3ab743ce
DATA expc<>+216(SB)/4, $0x3ab743ce
DATA expc<>+220(SB)/4, $0x3ab743ce
DATA expc<>+224(SB)/4, $0x3c088908
DATA expc<>+228(SB)/4, $0x3c088908
DATA expc<>+232(SB)/4, $0x3c088908
DATA expc<>+236(SB)/4, $0x3c088908
DATA expc<>+240(SB)/4, $0x3c088908
DATA expc<>+244(SB)/4, $0x3c088908
DATA expc<>+248(SB)/4, $0x3c088908
DATA expc<>+252(SB)/4, $0x3c088908
DATA expc<>+256(SB)/4, $0x3d2aa9c1
DATA expc<>+260(SB)/4, $0x3d2aa9c1
DATA expc<>+264(SB)/4, $0x3d2aa9c1
DATA expc<>+268(SB)/4, $0x3d2aa9c1
DATA expc<>+272(SB)/4, $0x3d2aa9c1
DATA expc<>+276(SB)/4, $0x3d2aa9c1
DATA expc<>+280(SB)/4, $0x3d2aa9c1
DATA expc<>+284(SB)/4, $0x3d2aa9c1
DATA expc<>+288(SB)/4, $0x3e2aaaaa
DATA expc<>+292(SB)/4, $0x3e2aaaaa
DATA expc<>+296(SB)/4, $0x3e2aaaaa
DATA expc<>+300(SB)/4, $0x3e2aaaaa
DATA expc<>+304(SB)/4, $0x3e2aaaaa
DATA expc<>+308(SB)/4, $0x3e2aaaaa
DATA expc<>+312(SB)/4, $0x3e2aaaaa
DATA expc<>+316(SB)/4, $0x3e2aaaaa
DATA expc<>+320(SB)/4, $0x3f000000
DATA expc<>+324(SB)/4, $0x3f000000
DATA expc<>+328(SB)/4, $0x3f000000
DATA expc<>+332(SB)/4, $0x3f000000
DATA expc<>+336(SB)/4, $0x3f000000
DATA expc<>+340(SB)/4, $0x3f000000
DATA expc<>+344(SB)/4, $0x3f000000
DATA expc<>+348(SB)/4, $0x3f000000
DATA expc<>+352(SB)/4, $0x3f800000
DATA expc<>+356(SB)/4, $0x3f800000
DATA expc<>+360(SB)/4, $0x3f800000
DATA expc<>+364(SB)/4, $0x3f800000
DATA expc<>+368(SB)/4, $0x3f800000
DATA expc<>+372(SB)/4, $0x3f800000
DATA expc<>+376(SB)/4, $0x3f800000
DATA expc<>+380(SB)/4, $0x3f800000
GLOBL expc<>(SB), RODATA|NOPTR, $384

// tailmask holds 8 all-ones words then 8 zero words: the 8 words from
// byte 32-4*c on are the mask of the first c lanes.
DATA tailmask<>+0(SB)/4, $0xffffffff
DATA tailmask<>+4(SB)/4, $0xffffffff
DATA tailmask<>+8(SB)/4, $0xffffffff
DATA tailmask<>+12(SB)/4, $0xffffffff
DATA tailmask<>+16(SB)/4, $0xffffffff
DATA tailmask<>+20(SB)/4, $0xffffffff
DATA tailmask<>+24(SB)/4, $0xffffffff
DATA tailmask<>+28(SB)/4, $0xffffffff
DATA tailmask<>+32(SB)/4, $0x0
DATA tailmask<>+36(SB)/4, $0x0
DATA tailmask<>+40(SB)/4, $0x0
DATA tailmask<>+44(SB)/4, $0x0
DATA tailmask<>+48(SB)/4, $0x0
DATA tailmask<>+52(SB)/4, $0x0
DATA tailmask<>+56(SB)/4, $0x0
DATA tailmask<>+60(SB)/4, $0x0
GLOBL tailmask<>(SB), RODATA|NOPTR, $64

// EXPY replaces the 8 lanes of yx with exp(yx), within 2 ulp, clamping
// the input to [-87, 88.38] so that the result stays a normal float.
// yn and yt are clobbered. exp(x) = 2^n · e^r with n = round(x·log2 e)
// and r = x - n·ln 2; e^r is a degree-7 polynomial, and 2^n is added to
// its exponent bits.
#define EXPY(yx, yn, yt) \
	VMINPS expc<>+0(SB), yx, yx; \
	VMAXPS expc<>+32(SB), yx, yx; \
	VMULPS expc<>+64(SB), yx, yn; \
	VROUNDPS $0, yn, yn; \
	VFNMADD231PS expc<>+96(SB), yn, yx; \
	VFNMADD231PS expc<>+128(SB), yn, yx; \
	VMOVUPS expc<>+160(SB), yt; \
	VFMADD213PS expc<>+192(SB), yx, yt; \
	VFMADD213PS expc<>+224(SB), yx, yt; \
	VFMADD213PS expc<>+256(SB), yx, yt; \
	VFMADD213PS expc<>+288(SB), yx, yt; \
	VFMADD213PS expc<>+320(SB), yx, yt; \
	VMULPS yx, yt, yt; \
	VFMADD213PS yx, yx, yt; \
	VADDPS expc<>+352(SB), yt, yt; \
	VCVTPS2DQ yn, yn; \
	VPSLLD $23, yn, yn; \
	VPADDD yn, yt, yx

// TAILMASKY loads the mask of the first CX%8 lanes into Y15. Clobbers AX.
#define TAILMASKY \
	MOVQ    CX, AX; \
	ANDQ    $7, AX; \
	NEGQ    AX; \
	LEAQ    tailmask<>+32(SB), R8; \
	VMOVUPS (R8)(AX*4), Y15

// func expSumAVX2(x *float32, n int, shift float32) float32
// x[j] = exp(x[j] - shift); returns Σ x[j] (lanes of 8 in order, then a
// fixed tree across them).
TEXT ·expSumAVX2(SB), NOSPLIT, $0-28
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS shift+16(FP), Y14
	VXORPS       Y12, Y12, Y12
	XORQ         BX, BX
	MOVQ         CX, DX
	ANDQ         $-8, DX

es8:
	CMPQ    BX, DX
	JAE     estail
	VMOVUPS (DI)(BX*4), Y0
	VSUBPS  Y14, Y0, Y0
	EXPY(Y0, Y1, Y2)
	VMOVUPS Y0, (DI)(BX*4)
	VADDPS  Y0, Y12, Y12
	ADDQ    $8, BX
	JMP     es8

estail:
	TESTQ       $7, CX
	JZ          esreduce
	TAILMASKY
	VMASKMOVPS  (DI)(BX*4), Y15, Y0
	VSUBPS      Y14, Y0, Y0
	EXPY(Y0, Y1, Y2)
	VMASKMOVPS  Y0, Y15, (DI)(BX*4)
	VANDPS      Y15, Y0, Y0
	VADDPS      Y0, Y12, Y12

esreduce:
	VEXTRACTF128 $1, Y12, X13
	VADDPS       X13, X12, X12
	VHADDPS      X12, X12, X12
	VHADDPS      X12, X12, X12
	VMOVSS       X12, ret+24(FP)
	VZEROUPPER
	RET

// SILUY replaces the 8 lanes of yg with silu(yg)·yu = yg·yu / (1 +
// exp(-yg)). Y13 is zero; yx, yn, yt are clobbered.
#define SILUY(yg, yu, yx, yn, yt) \
	VSUBPS  yg, Y13, yx; \
	EXPY(yx, yn, yt); \
	VADDPS  expc<>+352(SB), yx, yx; \
	VMULPS  yu, yg, yg; \
	VDIVPS  yx, yg, yg

// func siluMulAVX2(gate *float32, up *float32, n int)
// gate[j] = silu(gate[j]) * up[j].
TEXT ·siluMulAVX2(SB), NOSPLIT, $0-24
	MOVQ   gate+0(FP), DI
	MOVQ   up+8(FP), SI
	MOVQ   n+16(FP), CX
	VXORPS Y13, Y13, Y13
	XORQ   BX, BX
	MOVQ   CX, DX
	ANDQ   $-8, DX

sm8:
	CMPQ    BX, DX
	JAE     smtail
	VMOVUPS (DI)(BX*4), Y0
	VMOVUPS (SI)(BX*4), Y4
	SILUY(Y0, Y4, Y1, Y2, Y3)
	VMOVUPS Y0, (DI)(BX*4)
	ADDQ    $8, BX
	JMP     sm8

smtail:
	TESTQ      $7, CX
	JZ         smdone
	TAILMASKY
	VMASKMOVPS (DI)(BX*4), Y15, Y0
	VMASKMOVPS (SI)(BX*4), Y15, Y4
	SILUY(Y0, Y4, Y1, Y2, Y3)
	VMASKMOVPS Y0, Y15, (DI)(BX*4)

smdone:
	VZEROUPPER
	RET

// func wsum4x16AVX2(p0, p1, p2, p3 *float32, v *float32, vs, n int, o0, o1, o2, o3 *float32)
// o_r[j] += Σ_q p_r[q] * v[q*vs+j] for r < 4, j < 16, q < n (n >= 1),
// each weight's product fused into the running sum in order, exactly as
// one axpy per weight would.
TEXT ·wsum4x16AVX2(SB), NOSPLIT, $0-88
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
	VMOVUPS (AX), Y0
	VMOVUPS 32(AX), Y1
	VMOVUPS (R12), Y2
	VMOVUPS 32(R12), Y3
	VMOVUPS (R13), Y4
	VMOVUPS 32(R13), Y5
	VMOVUPS (R14), Y6
	VMOVUPS 32(R14), Y7
	XORQ    BX, BX

ws16:
	VMOVUPS      (SI), Y8
	VMOVUPS      32(SI), Y9
	VBROADCASTSS (R8)(BX*4), Y10
	VBROADCASTSS (R9)(BX*4), Y11
	VBROADCASTSS (R10)(BX*4), Y12
	VBROADCASTSS (R11)(BX*4), Y13
	VFMADD231PS  Y8, Y10, Y0
	VFMADD231PS  Y9, Y10, Y1
	VFMADD231PS  Y8, Y11, Y2
	VFMADD231PS  Y9, Y11, Y3
	VFMADD231PS  Y8, Y12, Y4
	VFMADD231PS  Y9, Y12, Y5
	VFMADD231PS  Y8, Y13, Y6
	VFMADD231PS  Y9, Y13, Y7
	ADDQ         DX, SI
	INCQ         BX
	CMPQ         BX, CX
	JB           ws16

	VMOVUPS Y0, (AX)
	VMOVUPS Y1, 32(AX)
	VMOVUPS Y2, (R12)
	VMOVUPS Y3, 32(R12)
	VMOVUPS Y4, (R13)
	VMOVUPS Y5, 32(R13)
	VMOVUPS Y6, (R14)
	VMOVUPS Y7, 32(R14)
	VZEROUPPER
	RET

// func scaleToAVX2(dst *float32, src *float32, alpha float32, n int)
// dst[j] = src[j] * alpha; n % 8 == 0.
TEXT ·scaleToAVX2(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	VBROADCASTSS alpha+16(FP), Y15
	MOVQ         n+24(FP), CX
	XORQ         BX, BX

st8:
	CMPQ    BX, CX
	JAE     stdone
	VMULPS  (SI)(BX*4), Y15, Y0
	VMOVUPS Y0, (DI)(BX*4)
	ADDQ    $8, BX
	JMP     st8

stdone:
	VZEROUPPER
	RET

// func maxAVX2(x *float32, n int) float32
// The largest of x[0..n), n % 8 == 0 and n > 0, four vectors per step.
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	VMOVUPS (SI), Y0
	VMOVAPS Y0, Y1
	VMOVAPS Y0, Y2
	VMOVAPS Y0, Y3
	MOVQ    CX, AX
	ANDQ    $-32, AX
	XORQ    BX, BX

mx32:
	CMPQ   BX, AX
	JAE    mx8
	VMAXPS (SI)(BX*4), Y0, Y0
	VMAXPS 32(SI)(BX*4), Y1, Y1
	VMAXPS 64(SI)(BX*4), Y2, Y2
	VMAXPS 96(SI)(BX*4), Y3, Y3
	ADDQ   $32, BX
	JMP    mx32

mx8:
	CMPQ   BX, CX
	JAE    mxdone
	VMAXPS (SI)(BX*4), Y0, Y0
	ADDQ   $8, BX
	JMP    mx8

mxdone:
	VMAXPS       Y1, Y0, Y0
	VMAXPS       Y3, Y2, Y2
	VMAXPS       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0x4E, X0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0xB1, X0, X1
	VMAXPS       X1, X0, X0
	VMOVSS       X0, ret+16(FP)
	VZEROUPPER
	RET
