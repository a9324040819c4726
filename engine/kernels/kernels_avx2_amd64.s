//go:build amd64 && !purego

#include "textflag.h"

// AVX2+FMA+F16C kernels for CPUs without AVX-512. Vectors are 8 float32 in
// a ymm register; there are only 16 of them, so 4x4 tiles run as two 2x4
// passes. Every kernel handles k (or n) rounded down to a multiple of 8;
// the Go wrappers add the remaining columns. Decoding is as in the AVX-512
// kernels (see kernels_amd64.s).

// HSUM4 sums each of the ymm accumulators ya..yd across its 8 lanes and
// leaves the four sums in lanes 0..3 of xa. Clobbers yb, yc, xt.
#define HSUM4(ya, yb, yc, yd, xa, xt) \
	VHADDPS      yb, ya, ya; \
	VHADDPS      yd, yc, yc; \
	VHADDPS      yc, ya, ya; \
	VEXTRACTF128 $1, ya, xt; \
	VADDPS       xt, xa, xa

// BF16Y loads 8 bf16 weights from mem and widens them into ymm y.
#define BF16Y(mem, y) \
	VPMOVZXWD mem, y; \
	VPSLLD    $16, y, y

// FP8Y loads 8 fp8 weights from mem and decodes them (at 1/256 of their
// value) into ymm y via its low half x. Needs the word mask 0xBF80 in X15.
#define FP8Y(mem, x, y) \
	VPMOVSXBW mem, x; \
	VPSLLW    $7, x, x; \
	VPAND     X15, x, x; \
	VCVTPH2PS x, y

#define FP8MASKY \
	MOVL         $0xBF80, AX; \
	MOVD         AX, X15; \
	VPBROADCASTW X15, X15

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
#define ADD(x, mem) VADDPS mem, x, x; VMOVUPS x, mem

// func f32Dot2x4AVX2(x *float32, xs int, w *float32, ws int, k int, out *float32, os int)
// out[t*os+r] += Σ_j x[t*xs+j] * w[r*ws+j] for t < 2, r < 4; k % 8 == 0.
TEXT ·f32Dot2x4AVX2(SB), NOSPLIT, $0-56
	ROWS2x4(2)
	ZERO8Y
	XORQ BX, BX

f24loop:
	VMOVUPS (SI)(BX*4), Y8
	VMOVUPS (R9)(BX*4), Y9
	VMOVUPS (DI)(BX*4), Y10
	VMOVUPS (R12)(BX*4), Y11
	VMOVUPS (R13)(BX*4), Y12
	VMOVUPS (R8)(BX*4), Y13
	F24FMA
	ADDQ    $8, BX
	CMPQ    BX, CX
	JB      f24loop
	OUT2x4(ADD)
	VZEROUPPER
	RET

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

// func f32Dot1x4AVX2(x *float32, w *float32, ws int, k int, out *float32)
// out[r] += Σ_j x[j] * w[r*ws+j] for r < 4; k % 8 == 0. Two sets of
// accumulators (Y0-Y3, Y4-Y7) over 16 columns per iteration.
TEXT ·f32Dot1x4AVX2(SB), NOSPLIT, $0-40
	ROWS1x4(2)
	ZERO8Y
	XORQ BX, BX
	MOVQ CX, AX
	ANDQ $-16, AX
	JZ   f14one

f14loop:
	VMOVUPS     (SI)(BX*4), Y8
	VMOVUPS     32(SI)(BX*4), Y9
	VFMADD231PS (DI)(BX*4), Y8, Y0
	VFMADD231PS (R9)(BX*4), Y8, Y1
	VFMADD231PS (R10)(BX*4), Y8, Y2
	VFMADD231PS (R11)(BX*4), Y8, Y3
	VFMADD231PS 32(DI)(BX*4), Y9, Y4
	VFMADD231PS 32(R9)(BX*4), Y9, Y5
	VFMADD231PS 32(R10)(BX*4), Y9, Y6
	VFMADD231PS 32(R11)(BX*4), Y9, Y7
	ADDQ        $16, BX
	CMPQ        BX, AX
	JB          f14loop

f14one:
	CMPQ BX, CX
	JAE  f14reduce
	VMOVUPS     (SI)(BX*4), Y8
	VFMADD231PS (DI)(BX*4), Y8, Y0
	VFMADD231PS (R9)(BX*4), Y8, Y1
	VFMADD231PS (R10)(BX*4), Y8, Y2
	VFMADD231PS (R11)(BX*4), Y8, Y3

f14reduce:
	VADDPS  Y4, Y0, Y0
	VADDPS  Y5, Y1, Y1
	VADDPS  Y6, Y2, Y2
	VADDPS  Y7, Y3, Y3
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	MOVQ    out+32(FP), R8
	VADDPS  (R8), X0, X0
	VMOVUPS X0, (R8)
	VZEROUPPER
	RET

// func bf16Dot1x4AVX2(x *float32, w *uint16, ws int, k int, out *float32)
// out[r] = Σ_j x[j] * bf16(w[r*ws+j]) for r < 4; k % 8 == 0.
TEXT ·bf16Dot1x4AVX2(SB), NOSPLIT, $0-40
	ROWS1x4(1)
	ZERO8Y
	XORQ BX, BX
	MOVQ CX, AX
	ANDQ $-16, AX
	JZ   b14one

b14loop:
	VMOVUPS     (SI)(BX*4), Y8
	VMOVUPS     32(SI)(BX*4), Y9
	BF16Y((DI)(BX*2), Y10)
	BF16Y((R9)(BX*2), Y11)
	BF16Y((R10)(BX*2), Y12)
	BF16Y((R11)(BX*2), Y13)
	F14FMA
	BF16Y(16(DI)(BX*2), Y10)
	BF16Y(16(R9)(BX*2), Y11)
	BF16Y(16(R10)(BX*2), Y12)
	BF16Y(16(R11)(BX*2), Y13)
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y9, Y7
	ADDQ        $16, BX
	CMPQ        BX, AX
	JB          b14loop

b14one:
	CMPQ BX, CX
	JAE  b14reduce
	VMOVUPS (SI)(BX*4), Y8
	BF16Y((DI)(BX*2), Y10)
	BF16Y((R9)(BX*2), Y11)
	BF16Y((R10)(BX*2), Y12)
	BF16Y((R11)(BX*2), Y13)
	F14FMA

b14reduce:
	VADDPS  Y4, Y0, Y0
	VADDPS  Y5, Y1, Y1
	VADDPS  Y6, Y2, Y2
	VADDPS  Y7, Y3, Y3
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	MOVQ    out+32(FP), R8
	VMOVUPS X0, (R8)
	VZEROUPPER
	RET

// func fp8Dot1x4AVX2(x *float32, w *uint8, ws int, k int, out *float32)
// out[r] = Σ_j x[j] * fp8(w[r*ws+j]) / 256 for r < 4; k % 8 == 0.
TEXT ·fp8Dot1x4AVX2(SB), NOSPLIT, $0-40
	ROWS1x4(0)
	FP8MASKY
	ZERO8Y
	XORQ BX, BX
	MOVQ CX, AX
	ANDQ $-16, AX
	JZ   e14one

e14loop:
	VMOVUPS     (SI)(BX*4), Y8
	VMOVUPS     32(SI)(BX*4), Y9
	FP8Y((DI)(BX*1), X10, Y10)
	FP8Y((R9)(BX*1), X11, Y11)
	FP8Y((R10)(BX*1), X12, Y12)
	FP8Y((R11)(BX*1), X13, Y13)
	F14FMA
	FP8Y(8(DI)(BX*1), X10, Y10)
	FP8Y(8(R9)(BX*1), X11, Y11)
	FP8Y(8(R10)(BX*1), X12, Y12)
	FP8Y(8(R11)(BX*1), X13, Y13)
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y9, Y7
	ADDQ        $16, BX
	CMPQ        BX, AX
	JB          e14loop

e14one:
	CMPQ BX, CX
	JAE  e14reduce
	VMOVUPS (SI)(BX*4), Y8
	FP8Y((DI)(BX*1), X10, Y10)
	FP8Y((R9)(BX*1), X11, Y11)
	FP8Y((R10)(BX*1), X12, Y12)
	FP8Y((R11)(BX*1), X13, Y13)
	F14FMA

e14reduce:
	VADDPS  Y4, Y0, Y0
	VADDPS  Y5, Y1, Y1
	VADDPS  Y6, Y2, Y2
	VADDPS  Y7, Y3, Y3
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	MOVQ    out+32(FP), R8
	VMOVUPS X0, (R8)
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
