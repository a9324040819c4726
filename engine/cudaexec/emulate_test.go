package cudaexec

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// emulator runs the GPU forward pass on the host: the same Plan, the
// same resolved Weights and the same sequence of kernels as
// Model.forward, each kernel written in Go from its PTX's contract. It
// checks the host-side half of the GPU model (planning, weight
// resolution, scale indexing, the order of the kernels) against the CPU
// model without a GPU.
type emulator struct {
	cfg        model.Config
	w          *Weights
	numBlocks  int
	keys, vals [][]float32 // per layer: [block*16+slot][toksize]
}

func newEmulator(cfg model.Config, w *Weights, numBlocks int) *emulator {
	e := &emulator{cfg: cfg, w: w, numBlocks: numBlocks}
	tok := cfg.NumKVHeads * cfg.HeadDim
	for range cfg.NumLayers {
		e.keys = append(e.keys, make([]float32, numBlocks*kvcache.BlockSize*tok))
		e.vals = append(e.vals, make([]float32, numBlocks*kvcache.BlockSize*tok))
	}
	return e
}

// weightBytes returns a matrix's raw device bytes.
func weightBytes(t *testing.T, m *Matrix) []byte {
	if m.Host != nil {
		return m.Host
	}
	b := make([]byte, m.Rows*m.Cols*m.ElemSize())
	if err := m.Mem.CopyOut(b, m.Off); err != nil {
		t.Fatal(err)
	}
	return b
}

// deq is element i of a matrix's bytes, unscaled.
func deq(m *Matrix, b []byte, i int) float32 {
	switch m.Kind {
	case WeightBF16:
		return math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
	case WeightFP8:
		return FP8Value(b[i])
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

// matmul is the GEMV kernel's contract: per column block a partial sum,
// times the block's scale.
func matmul(t *testing.T, y, x []float32, n int, m *Matrix) {
	b := weightBytes(t, m)
	for tok := range n {
		for r := range m.Rows {
			var acc float32
			for c0 := 0; c0 < m.Cols; c0 += m.BC {
				var part float32
				for c := c0; c < min(m.Cols, c0+m.BC); c++ {
					part += x[tok*m.Cols+c] * deq(m, b, r*m.Cols+c)
				}
				if m.Kind == WeightFP8 {
					part *= m.Scales[(r/m.BR)*m.SCols+c0/m.BC]
				}
				acc += part
			}
			y[tok*m.Rows+r] = acc
		}
	}
}

func rmsnorm(out, x, w []float32, d int, eps float32) {
	for r := range len(x) / d {
		var ss float32
		for _, v := range x[r*d : (r+1)*d] {
			ss += v * v
		}
		inv := 1 / float32(math.Sqrt(float64(ss/float32(d)+eps)))
		for i := range d {
			out[r*d+i] = x[r*d+i] * inv * w[i]
		}
	}
}

func (e *emulator) forward(t *testing.T, p *Plan) []float32 {
	c := &e.cfg
	n, d, hd := len(p.Tokens), c.HiddenSize, c.HeadDim
	q, kvd, f := c.NumHeads*hd, c.NumKVHeads*hd, c.IntermediateSize
	x, h := make([]float32, n*d), make([]float32, n*d)
	qb, kb, vb, att := make([]float32, n*q), make([]float32, n*kvd), make([]float32, n*kvd), make([]float32, n*q)
	gate, up := make([]float32, n*f), make([]float32, n*f)
	emb := weightBytes(t, &e.w.Embed)
	for i, tok := range p.Tokens {
		for j := range d {
			x[i*d+j] = deq(&e.w.Embed, emb, int(tok)*d+j)
		}
	}
	eps := float32(c.RMSNormEps)
	for l := range e.w.Layers {
		w := &e.w.Layers[l]
		rmsnorm(h, x, w.AttnNorm, d, eps)
		matmul(t, qb, h, n, &w.Q)
		matmul(t, kb, h, n, &w.K)
		matmul(t, vb, h, n, &w.V)
		half := hd / 2
		for i := range n { // rope
			cs := p.Rope[i*hd:]
			for head := range c.NumHeads + c.NumKVHeads {
				var v []float32
				if head < c.NumHeads {
					v = qb[(i*c.NumHeads+head)*hd:]
				} else {
					v = kb[(i*c.NumKVHeads+head-c.NumHeads)*hd:]
				}
				for j := range half {
					x0, x1 := v[j], v[j+half]
					v[j], v[j+half] = x0*cs[j]-x1*cs[half+j], x1*cs[j]+x0*cs[half+j]
				}
			}
		}
		for i := range n { // kv_store
			copy(e.keys[l][int(p.Slots[i])*kvd:][:kvd], kb[i*kvd:])
			copy(e.vals[l][int(p.Slots[i])*kvd:][:kvd], vb[i*kvd:])
		}
		group, scale := c.NumHeads/c.NumKVHeads, float32(1/math.Sqrt(float64(hd)))
		for i := range n { // paged_attention
			length := int(p.Positions[i]) + 1
			slot := func(pos int) int {
				return int(p.Tables[int(p.TableOff[i])+pos/kvcache.BlockSize])*kvcache.BlockSize + pos%kvcache.BlockSize
			}
			for head := range c.NumHeads {
				kvoff := head / group * hd
				s := make([]float32, length)
				m := float32(math.Inf(-1))
				for pos := range length {
					for j := range hd {
						s[pos] += qb[(i*c.NumHeads+head)*hd+j] * scale * e.keys[l][slot(pos)*kvd+kvoff+j]
					}
					m = max(m, s[pos])
				}
				var sum float32
				for pos := range s {
					s[pos] = float32(math.Exp(float64(s[pos] - m)))
					sum += s[pos]
				}
				for j := range hd {
					var acc float32
					for pos := range length {
						acc += s[pos] * e.vals[l][slot(pos)*kvd+kvoff+j]
					}
					att[(i*c.NumHeads+head)*hd+j] = acc * (1 / sum)
				}
			}
		}
		matmul(t, h, att, n, &w.O)
		for i := range x {
			x[i] += h[i]
		}
		rmsnorm(h, x, w.MLPNorm, d, eps)
		matmul(t, gate, h, n, &w.Gate)
		matmul(t, up, h, n, &w.Up)
		for i, g := range gate {
			gate[i] = g / (1 + float32(math.Exp(float64(-g)))) * up[i]
		}
		matmul(t, h, gate, n, &w.Down)
		for i := range x {
			x[i] += h[i]
		}
	}
	rows := len(p.LogitRows)
	g, gn := make([]float32, rows*d), make([]float32, rows*d)
	for j, r := range p.LogitRows {
		copy(g[j*d:(j+1)*d], x[int(r)*d:])
	}
	rmsnorm(gn, g, e.w.Norm, d, eps)
	logits := make([]float32, rows*c.VocabSize)
	matmul(t, logits, gn, rows, &e.w.LMHead)
	return logits
}

// TestEmulatedGPUForwardMatchesCPU plans the batches of a chunked prefill
// and decodes of two sequences as the GPU model does, runs them through
// the emulated kernels over weights resolved from device-like memory
// (misaligned for the BF16 case, so that resolution re-homes them) and
// compares logits with the CPU model's.
func TestEmulatedGPUForwardMatchesCPU(t *testing.T) {
	for _, tc := range []struct {
		dt    dtype.DType
		align int
	}{{dtype.F32, 64}, {dtype.BF16, 3}, {dtype.F8E4M3, 8}} {
		t.Run(tc.dt.String(), func(t *testing.T) {
			cfg := model.Config{ModelType: "llama", HiddenSize: 128, IntermediateSize: 200, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
				HeadDim: 32, VocabSize: 300, MaxPositionEmbeddings: 512, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu",
				RopeScaling: &model.RopeScaling{RopeType: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}}
			if tc.dt == dtype.F8E4M3 {
				cfg.Quantization = &model.QuantizationConfig{QuantMethod: "fp8", WeightBlockSize: []int{64, 64}}
			}
			src := convertSource(t, cfg, tc.dt, 64)
			w, err := ResolveWeights(&cfg, hostTensors(src, tc.align))
			if err != nil {
				t.Fatal(err)
			}
			ks, err := kernels.Default()
			if err != nil {
				t.Fatal(err)
			}
			pool := ks.NewPool(2)
			defer pool.Close()
			cpu, err := model.New(cfg, memSource(src), pool)
			if err != nil {
				t.Fatal(err)
			}
			const blocks = 32
			kv, err := kvcache.New(cpu.KVShape(), blocks)
			if err != nil {
				t.Fatal(err)
			}
			defer kv.Free()
			emu := newEmulator(cfg, w, blocks)
			freqs := cfg.InverseFrequencies()
			tables := [][]int32{{5, 1, 7, 3}, {2, 9, 4, 0}}
			lens := []int{0, 0}
			for si, counts := range [][]int{{20, 17}, {1, 18}, {1, 1}, {1, 1}} {
				b := &model.Batch{BlockTables: tables}
				for s, c := range counts {
					for range c {
						b.Tokens = append(b.Tokens, int32((lens[s]*37+s*11)%cfg.VocabSize))
						b.Positions = append(b.Positions, int32(lens[s]))
						b.Seqs = append(b.Seqs, int32(s))
						lens[s]++
					}
					b.LogitRows = append(b.LogitRows, len(b.Tokens)-1)
				}
				want := make([]float32, len(b.LogitRows)*cfg.VocabSize)
				if err := cpu.Forward(b, kv, want); err != nil {
					t.Fatal(err)
				}
				p, err := NewPlan(&cfg, freqs, blocks, b)
				if err != nil {
					t.Fatal(err)
				}
				got := emu.forward(t, p)
				var worst, scale float64
				for i := range want {
					worst = max(worst, math.Abs(float64(got[i]-want[i])))
					scale = max(scale, math.Abs(float64(want[i])))
				}
				if worst > 1e-3*scale+1e-4 {
					t.Errorf("step %d: emulated GPU logits differ from the CPU's by up to %g (largest %g)", si, worst, scale)
				}
			}
		})
	}
}

// memSource is a TensorSource held in a map.
type memSource map[string]model.Tensor

func (m memSource) Lookup(name string) (model.Tensor, bool) {
	t, ok := m[name]
	return t, ok
}

// convertSource returns random weights for cfg in dt: F32, BF16 (every
// tensor) or F8E4M3 (projections block-quantised with the engine's own
// quantiser, block×block, the rest BF16).
func convertSource(t *testing.T, cfg model.Config, dt dtype.DType, block int) map[string]model.Tensor {
	t.Helper()
	src := model.RandomSource(cfg, 7, 0.2)
	out := map[string]model.Tensor{}
	for _, ns := range cfg.TensorShapes() {
		tt, _ := src.Lookup(ns.Name)
		f, err := dtype.ToFloat32(tt.DType, tt.Data)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case dt == dtype.F32:
			out[ns.Name] = tt
		case dt == dtype.F8E4M3 && model.IsProjection(ns.Name):
			for _, e := range checkpoint.FP8Entries(ns.Name, ns.Shape, block, func() ([]float32, error) { return f, nil }) {
				b, err := e.Bytes()
				if err != nil {
					t.Fatal(err)
				}
				out[e.Name] = model.Tensor{DType: e.DType, Shape: e.Shape, Data: b, Source: "memory"}
			}
		default:
			b, err := dtype.FromFloat32(dtype.BF16, f)
			if err != nil {
				t.Fatal(err)
			}
			out[ns.Name] = model.Tensor{DType: dtype.BF16, Shape: ns.Shape, Data: b, Source: "memory"}
		}
	}
	return out
}
