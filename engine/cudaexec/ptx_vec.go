package cudaexec

import (
	"fmt"
	"strings"
)

// KernelGEMV4 is the name of the vectorised GEMV kernel for weights of
// kind k: each lane loads four consecutive weights (and four floats of
// each token's row) per instruction, so a warp moves 128 weights per
// load. It needs Cols and BC to be multiples of 4 and the weight's
// address aligned to four elements (GEMV4Fits).
func KernelGEMV4(k WeightKind) string { return "gemv4_" + k.String() }

// GEMV4Fits reports whether matrix m at device address addr can run
// through the vectorised GEMV.
func GEMV4Fits(m *Matrix, addr uint64) bool {
	return m.Cols%4 == 0 && m.BC%4 == 0 && addr%uint64(4*m.ElemSize()) == 0
}

// loadWeight4 emits the load of elements idx…idx+3 (u64 element index
// register, a multiple of 4) of weight w into f32 registers %f30…%f33,
// unscaled.
func loadWeight4(k WeightKind, w, idx string) string {
	switch k {
	case WeightFP8:
		var b strings.Builder
		fmt.Fprintf(&b, "\tadd.u64 %%rd50, %s, %s;\n\tld.global.u32 %%r51, [%%rd50];\n", w, idx)
		for j := range 4 {
			fmt.Fprintf(&b, "\tbfe.u32 %%r52, %%r51, %d, 8;\n\tmul.wide.u32 %%rd51, %%r52, 4;\n\tadd.u64 %%rd51, %%lut, %%rd51;\n\tld.global.f32 %%f%d, [%%rd51];\n", 8*j, 30+j)
		}
		return b.String()
	case WeightBF16:
		return fmt.Sprintf(`	shl.b64 %%rd50, %[2]s, 1;
	add.u64 %%rd50, %[1]s, %%rd50;
	ld.global.v2.u32 {%%r51, %%r52}, [%%rd50];
	shl.b32 %%r53, %%r51, 16;
	mov.b32 %%f30, %%r53;
	and.b32 %%r53, %%r51, -65536;
	mov.b32 %%f31, %%r53;
	shl.b32 %%r53, %%r52, 16;
	mov.b32 %%f32, %%r53;
	and.b32 %%r53, %%r52, -65536;
	mov.b32 %%f33, %%r53;
`, w, idx)
	}
	return fmt.Sprintf(`	shl.b64 %%rd50, %[2]s, 2;
	add.u64 %%rd50, %[1]s, %%rd50;
	ld.global.v4.f32 {%%f30, %%f31, %%f32, %%f33}, [%%rd50];
`, w, idx)
}

// gemv4Kernel is gemvKernel with four columns per lane and load.
func gemv4Kernel(b *strings.Builder, k WeightKind) {
	var body strings.Builder
	body.WriteString(threadIDs + weightRegs + `	.reg .b32 %wr, %t0, %cb, %c, %cend;
	.reg .b64 %xrow0, %xrow1, %xrow2, %xrow3, %wrow;
	mad.lo.u32 %wr, %row, 8, %warp;
	setp.ge.u32 %p1, %wr, %rows;
	@%p1 bra $K_done;
	mul.wide.u32 %wrow, %wr, %cols;
	sub.u32 %r40, %n, 1;
	mov.u32 %t0, 0;
$K_tokens:
	setp.ge.u32 %p2, %t0, %n;
	@%p2 bra $K_done;
`)
	for j := range GEMVTokens {
		fmt.Fprintf(&body, "\tadd.u32 %%r41, %%t0, %d;\n\tmin.u32 %%r41, %%r41, %%r40;\n\tmul.wide.u32 %%xrow%d, %%r41, %%cols;\n\tshl.b64 %%xrow%d, %%xrow%d, 2;\n\tadd.u64 %%xrow%d, %%x, %%xrow%d;\n\tmov.f32 %%f%d, 0f00000000;\n", j, j, j, j, j, j, 10+j)
	}
	body.WriteString(`	mov.u32 %cb, 0;
$K_blocks:
	mul.lo.u32 %c, %cb, %bc;
	setp.ge.u32 %p3, %c, %cols;
	@%p3 bra $K_reduce;
	add.u32 %cend, %c, %bc;
	min.u32 %cend, %cend, %cols;
	shl.b32 %r44, %lane, 2;
	add.u32 %c, %c, %r44;
`)
	for j := range GEMVTokens {
		fmt.Fprintf(&body, "\tmov.f32 %%f%d, 0f00000000;\n", 20+j)
	}
	body.WriteString(`$K_colloop:
	setp.ge.u32 %p4, %c, %cend;
	@%p4 bra $K_blockdone;
	cvt.u64.u32 %rd30, %c;
	add.u64 %rd31, %wrow, %rd30;
` + loadWeight4(k, "%w", "%rd31") + "\tshl.b64 %rd32, %rd30, 2;\n")
	for j := range GEMVTokens {
		fmt.Fprintf(&body, "\tadd.u64 %%rd33, %%xrow%d, %%rd32;\n\tld.global.v4.f32 {%%f40, %%f41, %%f42, %%f43}, [%%rd33];\n", j)
		for e := range 4 {
			fmt.Fprintf(&body, "\tfma.rn.f32 %%f%d, %%f%d, %%f%d, %%f%d;\n", 20+j, 40+e, 30+e, 20+j)
		}
	}
	body.WriteString("\tadd.u32 %c, %c, 128;\n\tbra $K_colloop;\n$K_blockdone:\n")
	if k == WeightFP8 {
		body.WriteString(`	div.u32 %r42, %wr, %br;
	mad.lo.u32 %r42, %r42, %scols, %cb;
	mul.wide.u32 %rd34, %r42, 4;
	add.u64 %rd34, %s, %rd34;
	ld.global.f32 %f3, [%rd34];
`)
		for j := range GEMVTokens {
			fmt.Fprintf(&body, "\tfma.rn.f32 %%f%d, %%f%d, %%f3, %%f%d;\n", 10+j, 20+j, 10+j)
		}
	} else {
		for j := range GEMVTokens {
			fmt.Fprintf(&body, "\tadd.f32 %%f%d, %%f%d, %%f%d;\n", 10+j, 10+j, 20+j)
		}
	}
	body.WriteString("\tadd.u32 %cb, %cb, 1;\n\tbra $K_blocks;\n$K_reduce:\n")
	for j := range GEMVTokens {
		body.WriteString(warpReduce(fmt.Sprintf("%%f%d", 10+j), "%f4", "add"))
	}
	body.WriteString("\tsetp.ne.u32 %p5, %lane, 0;\n\t@%p5 bra $K_next;\n")
	for j := range GEMVTokens {
		fmt.Fprintf(&body, `	add.u32 %%r43, %%t0, %d;
	setp.ge.u32 %%p6, %%r43, %%n;
	@%%p6 bra $K_next;
	mul.wide.u32 %%rd35, %%r43, %%rows;
	cvt.u64.u32 %%rd36, %%wr;
	add.u64 %%rd35, %%rd35, %%rd36;
	shl.b64 %%rd35, %%rd35, 2;
	add.u64 %%rd35, %%y, %%rd35;
	st.global.f32 [%%rd35], %%f%d;
`, j, 10+j)
	}
	fmt.Fprintf(&body, "$K_next:\n\tadd.u32 %%t0, %%t0, %d;\n\tbra $K_tokens;\n$K_done:\n\tret;\n", GEMVTokens)
	kernel(b, KernelGEMV4(k), []string{"u64 y", "u64 x", "u64 w", "u64 s", "u32 n", "u32 rows", "u32 cols", "u32 br", "u32 bc", "u32 scols"}, body.String())
}
