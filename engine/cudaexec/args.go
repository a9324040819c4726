package cudaexec

import "math"

// Arg is one kernel argument as cuLaunchKernel reads it: a device
// address (u64), a 32-bit count (u32) or a float (f32), in the low bytes
// of an 8-byte slot.
type Arg struct {
	Type string
	Bits uint64
}

// Ptr is a device-address argument.
func Ptr(addr uint64) Arg { return Arg{"u64", addr} }

// U32 is a count argument.
func U32(v int) Arg { return Arg{"u32", uint64(uint32(v))} }

// F32 is a float argument.
func F32(v float32) Arg { return Arg{"f32", uint64(math.Float32bits(v))} }

// EmbedArgs are embed_f32's and embed_bf16's arguments.
func EmbedArgs(out, table, tokens uint64, d int) []Arg {
	return []Arg{Ptr(out), Ptr(table), Ptr(tokens), U32(d)}
}

// RMSNormArgs are rmsnorm's arguments.
func RMSNormArgs(out, x, w uint64, d int, eps float32) []Arg {
	return []Arg{Ptr(out), Ptr(x), Ptr(w), U32(d), F32(eps)}
}

// RopeArgs are rope's arguments.
func RopeArgs(q, k, cs uint64, heads, kvHeads, headDim int) []Arg {
	return []Arg{Ptr(q), Ptr(k), Ptr(cs), U32(heads), U32(kvHeads), U32(headDim)}
}

// KVStoreArgs are kv_store's arguments (kc, vc: one layer's caches).
func KVStoreArgs(kc, vc, k, v, slots uint64, tokSize int) []Arg {
	return []Arg{Ptr(kc), Ptr(vc), Ptr(k), Ptr(v), Ptr(slots), U32(tokSize)}
}

// AttentionArgs are paged_attention's arguments.
func AttentionArgs(out, q, kc, vc, tables, tableOff, positions uint64, heads, kvHeads, headDim int, scale float32) []Arg {
	return []Arg{Ptr(out), Ptr(q), Ptr(kc), Ptr(vc), Ptr(tables), Ptr(tableOff), Ptr(positions),
		U32(heads), U32(kvHeads), U32(headDim), F32(scale)}
}

// SiLUMulArgs are silu_mul's arguments.
func SiLUMulArgs(g, u uint64, count int) []Arg { return []Arg{Ptr(g), Ptr(u), U32(count)} }

// AddArgs are add_inplace's arguments.
func AddArgs(x, h uint64, count int) []Arg { return []Arg{Ptr(x), Ptr(h), U32(count)} }

// GatherArgs are gather_rows' arguments.
func GatherArgs(out, x, rows uint64, d int) []Arg {
	return []Arg{Ptr(out), Ptr(x), Ptr(rows), U32(d)}
}

// SGEMMArgs are sgemm_nt's arguments: y[t*ldy + r] = Σ x[t][c]·w[r][c].
func SGEMMArgs(y, x, w uint64, n, rows, cols, ldy int) []Arg {
	return []Arg{Ptr(y), Ptr(x), Ptr(w), U32(n), U32(rows), U32(cols), U32(ldy)}
}

// GEMVArgs are the gemv kernels' arguments for n tokens times matrix m
// at address w with scales at s (0 when it has none).
func GEMVArgs(y, x, w, s uint64, n int, m *Matrix) []Arg {
	return []Arg{Ptr(y), Ptr(x), Ptr(w), Ptr(s), U32(n), U32(m.Rows), U32(m.Cols), U32(m.BR), U32(m.BC), U32(m.SCols)}
}

// DequantArgs are the dequant kernels' arguments for rows [row0,
// row0+rows) of matrix m into out.
func DequantArgs(out, w, s uint64, m *Matrix, row0, rows int) []Arg {
	return []Arg{Ptr(out), Ptr(w), Ptr(s), U32(rows * m.Cols), U32(m.Cols), U32(row0), U32(m.BR), U32(m.BC), U32(m.SCols)}
}
