package cudaexec

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
)

// MaxContext is the longest sequence the attention kernel attends over:
// its scores of one query head sit in the 48 KiB of shared memory a
// kernel gets without opting in, less its reduction scratch.
const MaxContext = (48<<10 - 256) / 4

// Plan is one forward call as the kernels read it, computed on the host:
// per token its id, position, KV slot, the offset of its sequence's block
// table in Tables and its rotary table row; and the tokens whose logits
// are wanted.
type Plan struct {
	Tokens    []int32
	Positions []int32
	// Slots is, per token, block*16 + position%16: where its keys and
	// values go in each layer's cache.
	Slots []int32
	// TableOff is, per token, where its sequence's block table starts in
	// Tables (every sequence's table, back to back).
	TableOff []int32
	Tables   []int32
	// Rope is, per token, cos then sin of position × frequency for each
	// half-dimension of a head (HeadDim floats).
	Rope      []float32
	LogitRows []int32
	// MaxLen is the longest sequence any token attends over (position+1).
	MaxLen int
}

// NewPlan checks b against cfg and a KV pool of numBlocks blocks and
// plans it. invFreq are the rotary frequencies (model.Config.InverseFrequencies).
func NewPlan(cfg *model.Config, invFreq []float64, numBlocks int, b *model.Batch) (*Plan, error) {
	n := len(b.Tokens)
	if len(b.Positions) != n || len(b.Seqs) != n {
		return nil, fmt.Errorf("batch: %d tokens but %d positions and %d sequence ids", n, len(b.Positions), len(b.Seqs))
	}
	p := &Plan{Tokens: b.Tokens, Positions: b.Positions, Slots: make([]int32, n), TableOff: make([]int32, n)}
	offs := make([]int32, len(b.BlockTables))
	for s, t := range b.BlockTables {
		offs[s] = int32(len(p.Tables))
		for _, blk := range t {
			if blk < 0 || int(blk) >= numBlocks {
				return nil, fmt.Errorf("batch: block %d of sequence %d is outside the KV pool (%d blocks)", blk, s, numBlocks)
			}
		}
		p.Tables = append(p.Tables, t...)
	}
	limit := min(cfg.MaxPositionEmbeddings, MaxContext)
	for i := range n {
		tok, pos, seq := b.Tokens[i], b.Positions[i], b.Seqs[i]
		switch {
		case tok < 0 || int(tok) >= cfg.VocabSize:
			return nil, fmt.Errorf("batch: token %d at index %d is outside the vocabulary (%d)", tok, i, cfg.VocabSize)
		case pos < 0 || int(pos) >= limit:
			return nil, fmt.Errorf("batch: position %d at index %d is outside the context the GPU model attends over (%d)", pos, i, limit)
		case seq < 0 || int(seq) >= len(b.BlockTables):
			return nil, fmt.Errorf("batch: sequence %d at index %d has no block table", seq, i)
		case int(pos)/kvcache.BlockSize >= len(b.BlockTables[seq]):
			return nil, fmt.Errorf("batch: block table of sequence %d does not cover position %d", seq, pos)
		}
		blk := b.BlockTables[seq][int(pos)/kvcache.BlockSize]
		p.Slots[i] = blk*kvcache.BlockSize + pos%kvcache.BlockSize
		p.TableOff[i] = offs[seq]
		p.MaxLen = max(p.MaxLen, int(pos)+1)
	}
	for _, r := range b.LogitRows {
		if r < 0 || r >= n {
			return nil, fmt.Errorf("batch: logit row %d is outside the batch (%d tokens)", r, n)
		}
		p.LogitRows = append(p.LogitRows, int32(r))
	}
	p.Rope = RopeTable(cfg.HeadDim, invFreq, b.Positions, nil)
	return p, nil
}

// RopeTable fills, per position, cos then sin of position × frequency for
// each half-dimension of a head, computed in float64 as the CPU model
// does, into out (grown as needed).
func RopeTable(headDim int, invFreq []float64, positions []int32, out []float32) []float32 {
	half := headDim / 2
	if cap(out) < len(positions)*headDim {
		out = make([]float32, len(positions)*headDim)
	}
	out = out[:len(positions)*headDim]
	for i, pos := range positions {
		row := out[i*headDim : (i+1)*headDim]
		for j, f := range invFreq[:half] {
			s, c := math.Sincos(float64(pos) * f)
			row[j], row[half+j] = float32(c), float32(s)
		}
	}
	return out
}

// Packed is a plan laid out in one host buffer, uploaded with one copy;
// each field is the byte offset of its array (4-byte values, 256-byte
// aligned).
type Packed struct {
	Bytes                                                   []byte
	Tokens, Positions, Slots, TableOff, Tables, Rope, Logit int64
}

// packAlign aligns each array of a packed plan.
const packAlign = 256

// Pack lays the plan's arrays out back to back in buf (grown as needed).
func (p *Plan) Pack(buf []byte) Packed {
	var pk Packed
	size := int64(0)
	place := func(n int) int64 {
		off := size
		size += (int64(4*n) + packAlign - 1) / packAlign * packAlign
		return off
	}
	pk.Tokens = place(len(p.Tokens))
	pk.Positions = place(len(p.Positions))
	pk.Slots = place(len(p.Slots))
	pk.TableOff = place(len(p.TableOff))
	pk.Tables = place(len(p.Tables))
	pk.Rope = place(len(p.Rope))
	pk.Logit = place(len(p.LogitRows))
	if int64(cap(buf)) < size {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	put := func(off int64, v []int32) {
		for i, x := range v {
			binary.LittleEndian.PutUint32(buf[off+int64(4*i):], uint32(x))
		}
	}
	put(pk.Tokens, p.Tokens)
	put(pk.Positions, p.Positions)
	put(pk.Slots, p.Slots)
	put(pk.TableOff, p.TableOff)
	put(pk.Tables, p.Tables)
	for i, x := range p.Rope {
		binary.LittleEndian.PutUint32(buf[pk.Rope+int64(4*i):], math.Float32bits(x))
	}
	put(pk.Logit, p.LogitRows)
	pk.Bytes = buf
	return pk
}

// Launch is one kernel launch's geometry.
type Launch struct {
	Grid, Block [3]int
	Shared      int
}

// rowThreads is the CTA size of the kernels that give one CTA a row.
const rowThreads = 256

// RowLaunch is the geometry of a kernel with one CTA per row (embed,
// rmsnorm, rope, kv_store, gather).
func RowLaunch(rows int) Launch {
	return Launch{Grid: [3]int{rows, 1, 1}, Block: [3]int{rowThreads, 1, 1}}
}

// AttentionThreads is the CTA size of the attention kernel.
const AttentionThreads = 128

// AttentionLaunch is the attention kernel's geometry: a CTA per token and
// query head, with maxLen scores in shared memory.
func AttentionLaunch(tokens, heads, maxLen int) (Launch, error) {
	if maxLen > MaxContext {
		return Launch{}, fmt.Errorf("attention over %d positions: the kernel holds at most %d", maxLen, MaxContext)
	}
	return Launch{Grid: [3]int{tokens, heads, 1}, Block: [3]int{AttentionThreads, 1, 1}, Shared: 4 * maxLen}, nil
}

// ElementwiseLaunch is the geometry of a grid-stride kernel over count
// elements, capped at a grid that fills a large GPU several times over.
func ElementwiseLaunch(count int) Launch {
	const threads, maxBlocks = 256, 4096
	blocks := max(1, min(maxBlocks, (count+threads-1)/threads))
	return Launch{Grid: [3]int{blocks, 1, 1}, Block: [3]int{threads, 1, 1}}
}

// GEMVLaunch is the geometry of a GEMV over a matrix of rows rows: a warp
// per row, GEMVWarps rows per CTA.
func GEMVLaunch(rows int) Launch {
	return Launch{Grid: [3]int{(rows + GEMVWarps - 1) / GEMVWarps, 1, 1}, Block: [3]int{32 * GEMVWarps, 1, 1}}
}

// SGEMMLaunch is the geometry of the PTX SGEMM for n tokens and rows
// output rows.
func SGEMMLaunch(n, rows int) Launch {
	return Launch{Grid: [3]int{(rows + SGEMMTile - 1) / SGEMMTile, (n + SGEMMTile - 1) / SGEMMTile, 1}, Block: [3]int{SGEMMTile, SGEMMTile, 1}}
}

// DequantChunkRows is how many rows of a matrix one dequantisation into
// the float32 scratch covers when a GEMM is too large for the GEMV: the
// scratch holds at most DequantScratchFloats floats.
func DequantChunkRows(rows, cols int) int {
	return max(1, min(rows, DequantScratchFloats/cols))
}

// DequantScratchFloats bounds the float32 scratch a dequantising GEMM
// expands weights into (64 MiB).
const DequantScratchFloats = 16 << 20
