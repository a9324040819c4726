//go:build cuda

package cudaexec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/stokehq/stoke/engine/device/cuda"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
)

// devMatrix is a Matrix with its device addresses resolved.
type devMatrix struct {
	*Matrix
	addr, scales uint64
}

type devLayer struct {
	attnNorm, mlpNorm          uint64
	q, k, v, o, gate, up, down devMatrix
}

// Model is a Llama model whose weights sit in one CUDA device's memory,
// with the PTX kernels of Module loaded. It is not safe for concurrent
// use: one executor drives it.
type Model struct {
	dev     *cuda.Device
	cfg     model.Config
	opts    Options
	invFreq []float64
	w       *Weights
	mod     cu.Module
	fn      map[string]cu.Function
	gemm    sgemmer
	owned   []*cuda.Buffer
	embed   devMatrix
	lmHead  devMatrix
	norm    uint64
	layers  []devLayer
	// scratch is the float32 expansion of weights a dequantising GEMM
	// multiplies (nil until one is needed).
	scratch *cuda.Buffer
}

// sgemmer multiplies y[t*ldy + r] = Σ_c x[t][c]·w[r][c] for float32 w.
type sgemmer interface {
	sgemm(y, x, w uint64, n, rows, cols, ldy int) error
	name() string
	close() error
}

// New builds a model over tensors already in dev's memory (a checkpoint
// the streaming loader put there, or one UploadSource copied): matrices
// are computed on in place; norms, scales and tensors in a dtype the
// kernels do not read go into buffers of the model's own.
func New(ctx context.Context, dev *cuda.Device, cfg model.Config, src DeviceSource, opts Options) (_ *Model, err error) {
	opts = opts.withDefaults()
	w, err := ResolveWeights(&cfg, src)
	if err != nil {
		return nil, err
	}
	m := &Model{dev: dev, cfg: cfg, opts: opts, invFreq: cfg.InverseFrequencies(), w: w, fn: map[string]cu.Function{}}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	err = dev.Do(func() error {
		mod, err := cu.LoadData(Module())
		if err != nil {
			// Again, for the JIT compiler's error log.
			log := make([]byte, 16<<10)
			if _, again := cu.LoadDataEx(Module(), &cu.JITErrorLogBuffer{Buffer: log}); again != nil {
				if n := bytes.IndexByte(log, 0); n >= 0 {
					log = log[:n]
				}
				return fmt.Errorf("load the PTX kernels on %s: %w: %s", dev.Name(), err, bytes.TrimSpace(log))
			}
			return fmt.Errorf("load the PTX kernels on %s: %w", dev.Name(), err)
		}
		m.mod = mod
		for _, name := range KernelNames() {
			f, err := mod.Function(name)
			if err != nil {
				return fmt.Errorf("find kernel %s: %w", name, err)
			}
			m.fn[name] = f
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if m.embed, err = m.place(ctx, &w.Embed); err != nil {
		return nil, err
	}
	if m.lmHead, err = m.place(ctx, &w.LMHead); err != nil {
		return nil, err
	}
	if m.norm, err = m.upload(ctx, f32Bytes(w.Norm)); err != nil {
		return nil, err
	}
	m.layers = make([]devLayer, len(w.Layers))
	for i := range w.Layers {
		l, dl := &w.Layers[i], &m.layers[i]
		if dl.attnNorm, err = m.upload(ctx, f32Bytes(l.AttnNorm)); err != nil {
			return nil, err
		}
		if dl.mlpNorm, err = m.upload(ctx, f32Bytes(l.MLPNorm)); err != nil {
			return nil, err
		}
		src := []*Matrix{&l.Q, &l.K, &l.V, &l.O, &l.Gate, &l.Up, &l.Down}
		dst := []*devMatrix{&dl.q, &dl.k, &dl.v, &dl.o, &dl.gate, &dl.up, &dl.down}
		for j := range src {
			if *dst[j], err = m.place(ctx, src[j]); err != nil {
				return nil, err
			}
		}
	}
	if m.gemm, err = newSGEMM(m); err != nil {
		return nil, err
	}
	opts.Logger.Info("gpu model ready", "device", dev.Name(), "gpu", dev.Model(), "layers", cfg.NumLayers,
		"weights", w.Embed.Kind.String()+"/"+w.Layers[0].Q.Kind.String(), "sgemm", m.gemm.name())
	return m, nil
}

// upload copies host bytes into a buffer the model owns.
func (m *Model) upload(ctx context.Context, b []byte) (uint64, error) {
	buf, err := m.dev.AllocBuffer(ctx, int64(len(b)))
	if err != nil {
		return 0, err
	}
	m.owned = append(m.owned, buf)
	if err := buf.CopyIn(0, b); err != nil {
		return 0, fmt.Errorf("upload %d bytes: %w", len(b), err)
	}
	return buf.DeviceAddr(), nil
}

// place resolves a matrix's addresses, uploading what is on the host.
func (m *Model) place(ctx context.Context, mat *Matrix) (devMatrix, error) {
	d := devMatrix{Matrix: mat}
	var err error
	if mat.Host != nil {
		if d.addr, err = m.upload(ctx, mat.Host); err != nil {
			return d, fmt.Errorf("upload %s: %w", mat.Name, err)
		}
	} else {
		d.addr = mat.Mem.DeviceAddr() + uint64(mat.Off)
	}
	if len(mat.Scales) > 0 {
		if d.scales, err = m.upload(ctx, f32Bytes(mat.Scales)); err != nil {
			return d, fmt.Errorf("upload the scales of %s: %w", mat.Name, err)
		}
	}
	return d, nil
}

// Config returns the model's configuration.
func (m *Model) Config() model.Config { return m.cfg }

// Device is the device the model computes on.
func (m *Model) Device() *cuda.Device { return m.dev }

// KVShape is the KV-cache geometry the model needs.
func (m *Model) KVShape() kvcache.Shape {
	return kvcache.Shape{Layers: m.cfg.NumLayers, KVHeads: m.cfg.NumKVHeads, HeadDim: m.cfg.HeadDim}
}

// WeightBytes is the size of the weights the forward pass reads each step.
func (m *Model) WeightBytes() int64 {
	n := m.w.Embed.Bytes()
	if !m.cfg.TieWordEmbeddings {
		n += m.w.LMHead.Bytes()
	}
	for i := range m.w.Layers {
		l := &m.w.Layers[i]
		for _, x := range []*Matrix{&l.Q, &l.K, &l.V, &l.O, &l.Gate, &l.Up, &l.Down} {
			n += x.Bytes()
		}
	}
	return n
}

// Close frees what the model allocated (not the tensors it was built
// over) and unloads its kernels.
func (m *Model) Close() error {
	var errs []error
	if m.gemm != nil {
		errs = append(errs, m.gemm.close())
		m.gemm = nil
	}
	for _, b := range m.owned {
		errs = append(errs, b.Free())
	}
	m.owned = nil
	if m.scratch != nil {
		errs = append(errs, m.scratch.Free())
		m.scratch = nil
	}
	var zero cu.Module
	if m.mod != zero {
		errs = append(errs, m.dev.Do(func() error { return m.mod.Unload() }))
		m.mod = zero
	}
	return errors.Join(errs...)
}

// launch runs a kernel on the default stream; the caller's thread has the
// context current (inside dev.Do).
func (m *Model) launch(name string, l Launch, args []Arg) error {
	fn, ok := m.fn[name]
	if !ok {
		return fmt.Errorf("launch %s: no such kernel", name)
	}
	slots := make([]uint64, len(args))
	ptrs := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		slots[i] = a.Bits
		ptrs[i] = unsafe.Pointer(&slots[i])
	}
	if err := fn.Launch(l.Grid[0], l.Grid[1], l.Grid[2], l.Block[0], l.Block[1], l.Block[2], l.Shared, cu.Stream{}, ptrs); err != nil {
		return fmt.Errorf("launch %s (grid %v, block %v, %d shared bytes): %w", name, l.Grid, l.Block, l.Shared, err)
	}
	return nil
}

// matmul computes y[t][r] = Σ_c x[t][c]·W[r][c] for n tokens.
func (m *Model) matmul(ctx context.Context, y, x uint64, n int, w devMatrix) error {
	if n <= m.opts.GEMVMaxTokens {
		name := KernelGEMV(w.Kind)
		if GEMV4Fits(w.Matrix, w.addr) && !m.opts.ScalarGEMV {
			name = KernelGEMV4(w.Kind)
		}
		return m.launch(name, GEMVLaunch(w.Rows), GEMVArgs(y, x, w.addr, w.scales, n, w.Matrix))
	}
	if w.Kind == WeightF32 {
		return m.gemm.sgemm(y, x, w.addr, n, w.Rows, w.Cols, w.Rows)
	}
	if m.scratch == nil {
		buf, err := m.dev.AllocBuffer(ctx, 4*DequantScratchFloats)
		if err != nil {
			return fmt.Errorf("allocate the dequantisation scratch: %w", err)
		}
		m.scratch = buf
	}
	chunk := DequantChunkRows(w.Rows, w.Cols)
	s := m.scratch.DeviceAddr()
	for r0 := 0; r0 < w.Rows; r0 += chunk {
		rows := min(chunk, w.Rows-r0)
		if err := m.launch(KernelDequant(w.Kind), ElementwiseLaunch(rows*w.Cols), DequantArgs(s, w.addr, w.scales, w.Matrix, r0, rows)); err != nil {
			return err
		}
		if err := m.gemm.sgemm(y+4*uint64(r0), x, s, n, rows, w.Cols, w.Rows); err != nil {
			return err
		}
	}
	return nil
}

// ptxSGEMM is the module's tiled SGEMM kernel.
type ptxSGEMM struct{ m *Model }

func (p ptxSGEMM) sgemm(y, x, w uint64, n, rows, cols, ldy int) error {
	return p.m.launch(KernelSGEMM, SGEMMLaunch(n, rows), SGEMMArgs(y, x, w, n, rows, cols, ldy))
}
func (ptxSGEMM) name() string { return "ptx" }
func (ptxSGEMM) close() error { return nil }

// UploadSource copies the host tensors cfg needs (and FP8 scales) from
// src into dev's memory, for a model built from a checkpoint directory or
// in-memory weights; free releases the copies.
func UploadSource(ctx context.Context, dev *cuda.Device, cfg *model.Config, src model.TensorSource) (_ DeviceTensors, free func() error, err error) {
	out := DeviceTensors{}
	var bufs []*cuda.Buffer
	free = func() error {
		var errs []error
		for _, b := range bufs {
			errs = append(errs, b.Free())
		}
		bufs = nil
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			free()
		}
	}()
	add := func(name string) error {
		t, ok := src.Lookup(name)
		if !ok {
			return nil // ResolveWeights names what is missing
		}
		if want := numel(t.Shape) * int64(t.DType.Size()); want != int64(len(t.Data)) {
			return fmt.Errorf("%s: tensor %s has %d bytes, shape %v of %v needs %d", t.Source, name, len(t.Data), t.Shape, t.DType, want)
		}
		buf, err := dev.AllocBuffer(ctx, int64(len(t.Data)))
		if err != nil {
			return fmt.Errorf("upload %s: %w", name, err)
		}
		bufs = append(bufs, buf)
		if err := buf.CopyIn(0, t.Data); err != nil {
			return fmt.Errorf("upload %s: %w", name, err)
		}
		out[name] = DeviceTensor{DType: t.DType, Shape: t.Shape, Mem: buf, Source: t.Source}
		return nil
	}
	for _, ns := range cfg.TensorShapes() {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		if err := add(ns.Name); err != nil {
			return nil, nil, err
		}
		if model.IsProjection(ns.Name) {
			base := ns.Name[:len(ns.Name)-len(".weight")]
			if err := add(base + ".weight_scale_inv"); err != nil {
				return nil, nil, err
			}
			if err := add(base + ".weight_scale"); err != nil {
				return nil, nil, err
			}
		}
	}
	return out, free, nil
}

// activations are one forward call's device arrays, grown on demand.
type activations struct {
	tokens                       int // capacity in tokens
	rows                         int // capacity in logit rows
	x, h, q, k, v, att, gate, up *cuda.Buffer
	g, gn, logits                *cuda.Buffer
	plan                         *cuda.Buffer
}

func (a *activations) free() error {
	var errs []error
	for _, b := range []*cuda.Buffer{a.x, a.h, a.q, a.k, a.v, a.att, a.gate, a.up, a.g, a.gn, a.logits, a.plan} {
		if b != nil {
			errs = append(errs, b.Free())
		}
	}
	*a = activations{}
	return errors.Join(errs...)
}

// grow makes sure buf holds size bytes, reallocating it (contents lost).
func grow(ctx context.Context, dev *cuda.Device, buf **cuda.Buffer, size int64) error {
	if *buf != nil && (*buf).Size() >= size {
		return nil
	}
	if *buf != nil {
		if err := (*buf).Free(); err != nil {
			return err
		}
		*buf = nil
	}
	b, err := dev.AllocBuffer(ctx, max(size, 256))
	if err != nil {
		return fmt.Errorf("allocate activations: %w", err)
	}
	*buf = b
	return nil
}

func (m *Model) size(ctx context.Context, a *activations, n, rows, planBytes int) error {
	c := &m.cfg
	d, q, kv, f := int64(c.HiddenSize), int64(c.NumHeads*c.HeadDim), int64(c.NumKVHeads*c.HeadDim), int64(c.IntermediateSize)
	if n > a.tokens {
		n64 := int64(max(n, 2*a.tokens))
		for _, s := range []struct {
			b    **cuda.Buffer
			size int64
		}{{&a.x, n64 * d}, {&a.h, n64 * d}, {&a.q, n64 * q}, {&a.k, n64 * kv}, {&a.v, n64 * kv}, {&a.att, n64 * q}, {&a.gate, n64 * f}, {&a.up, n64 * f}} {
			if err := grow(ctx, m.dev, s.b, 4*s.size); err != nil {
				return err
			}
		}
		a.tokens = int(n64)
	}
	if rows > a.rows {
		r64 := int64(max(rows, 2*a.rows))
		for _, s := range []struct {
			b    **cuda.Buffer
			size int64
		}{{&a.g, r64 * d}, {&a.gn, r64 * d}, {&a.logits, r64 * int64(c.VocabSize)}} {
			if err := grow(ctx, m.dev, s.b, 4*s.size); err != nil {
				return err
			}
		}
		a.rows = int(r64)
	}
	return grow(ctx, m.dev, &a.plan, int64(planBytes))
}

// KV is a paged KV pool in device memory: per layer, keys then values,
// each [block][slot][kvHead][headDim] float32, as kvcache.Cache lays
// them out on the host.
type KV struct {
	shape     kvcache.Shape
	numBlocks int
	buf       *cuda.Buffer
}

// NewKV allocates a pool of numBlocks blocks on the model's device.
func (m *Model) NewKV(ctx context.Context, numBlocks int) (*KV, error) {
	shape := m.KVShape()
	if numBlocks < 1 {
		return nil, fmt.Errorf("kv cache: %d blocks", numBlocks)
	}
	buf, err := m.dev.AllocBuffer(ctx, shape.BytesPerBlock()*int64(numBlocks))
	if err != nil {
		return nil, fmt.Errorf("kv cache of %d blocks: %w", numBlocks, err)
	}
	return &KV{shape: shape, numBlocks: numBlocks, buf: buf}, nil
}

// NumBlocks is the pool's capacity in blocks.
func (kv *KV) NumBlocks() int { return kv.numBlocks }

// layer returns the addresses of layer l's keys and values.
func (kv *KV) layer(l int) (keys, values uint64) {
	per := uint64(kv.numBlocks) * kvcache.BlockSize * uint64(kv.shape.TokenSize()) * 4
	base := kv.buf.DeviceAddr()
	return base + uint64(2*l)*per, base + uint64(2*l+1)*per
}

// Free releases the pool.
func (kv *KV) Free() error { return kv.buf.Free() }

// Forward runs a batch through the model as model.Model.Forward does,
// storing keys and values in kv, and writes the next-token logits of
// b.LogitRows into logits (len(b.LogitRows) × vocab_size).
func (m *Model) Forward(ctx context.Context, b *model.Batch, kv *KV, a *activations, logits []float32) error {
	c := &m.cfg
	if len(logits) != len(b.LogitRows)*c.VocabSize {
		return fmt.Errorf("logits buffer has %d values, want %d", len(logits), len(b.LogitRows)*c.VocabSize)
	}
	if kv.shape != m.KVShape() {
		return fmt.Errorf("kv cache shape %+v does not fit the model (%+v)", kv.shape, m.KVShape())
	}
	p, err := NewPlan(c, m.invFreq, kv.numBlocks, b)
	if err != nil {
		return err
	}
	n := len(p.Tokens)
	if n == 0 {
		return nil
	}
	pk := p.Pack(nil)
	if err := m.size(ctx, a, n, len(p.LogitRows), len(pk.Bytes)); err != nil {
		return err
	}
	if err := a.plan.CopyIn(0, pk.Bytes); err != nil {
		return fmt.Errorf("upload the step's plan: %w", err)
	}
	return m.dev.Do(func() error {
		if err := m.forward(ctx, p, pk, kv, a); err != nil {
			return err
		}
		if len(logits) == 0 {
			return nil
		}
		out := unsafe.Slice((*byte)(unsafe.Pointer(&logits[0])), 4*len(logits))
		if err := cu.MemcpyDtoH(unsafe.Pointer(&out[0]), cu.DevicePtr(a.logits.DeviceAddr()), int64(len(out))); err != nil {
			return fmt.Errorf("forward on %s: %w", m.dev.Name(), err)
		}
		return nil
	})
}

// forward enqueues every kernel of a planned step (inside dev.Do).
func (m *Model) forward(ctx context.Context, p *Plan, pk Packed, kv *KV, a *activations) error {
	c := &m.cfg
	n, d := len(p.Tokens), c.HiddenSize
	tokSize := c.NumKVHeads * c.HeadDim
	plan := a.plan.DeviceAddr()
	x, h, q, k, v, att := a.x.DeviceAddr(), a.h.DeviceAddr(), a.q.DeviceAddr(), a.k.DeviceAddr(), a.v.DeviceAddr(), a.att.DeviceAddr()
	gate, up := a.gate.DeviceAddr(), a.up.DeviceAddr()
	eps := float32(c.RMSNormEps)
	embed := KernelEmbedF32
	if m.embed.Kind == WeightBF16 {
		embed = KernelEmbedBF16
	}
	attn, err := AttentionLaunch(n, c.NumHeads, p.MaxLen)
	if err != nil {
		return err
	}
	var steps []func() error
	run := func(name string, l Launch, args []Arg) {
		steps = append(steps, func() error { return m.launch(name, l, args) })
	}
	mul := func(y, xin uint64, w devMatrix) {
		steps = append(steps, func() error { return m.matmul(ctx, y, xin, n, w) })
	}
	run(embed, RowLaunch(n), EmbedArgs(x, m.embed.addr, plan+uint64(pk.Tokens), d))
	for l := range m.layers {
		w := &m.layers[l]
		kc, vc := kv.layer(l)
		run(KernelRMSNorm, RowLaunch(n), RMSNormArgs(h, x, w.attnNorm, d, eps))
		mul(q, h, w.q)
		mul(k, h, w.k)
		mul(v, h, w.v)
		run(KernelRope, RowLaunch(n), RopeArgs(q, k, plan+uint64(pk.Rope), c.NumHeads, c.NumKVHeads, c.HeadDim))
		run(KernelKVStore, RowLaunch(n), KVStoreArgs(kc, vc, k, v, plan+uint64(pk.Slots), tokSize))
		run(KernelAttention, attn, AttentionArgs(att, q, kc, vc, plan+uint64(pk.Tables), plan+uint64(pk.TableOff),
			plan+uint64(pk.Positions), c.NumHeads, c.NumKVHeads, c.HeadDim, float32(1/math.Sqrt(float64(c.HeadDim)))))
		mul(h, att, w.o)
		run(KernelAdd, ElementwiseLaunch(n*d), AddArgs(x, h, n*d))
		run(KernelRMSNorm, RowLaunch(n), RMSNormArgs(h, x, w.mlpNorm, d, eps))
		mul(gate, h, w.gate)
		mul(up, h, w.up)
		run(KernelSiLUMul, ElementwiseLaunch(n*c.IntermediateSize), SiLUMulArgs(gate, up, n*c.IntermediateSize))
		mul(h, gate, w.down)
		run(KernelAdd, ElementwiseLaunch(n*d), AddArgs(x, h, n*d))
	}
	if rows := len(p.LogitRows); rows > 0 {
		g, gn := a.g.DeviceAddr(), a.gn.DeviceAddr()
		run(KernelGather, RowLaunch(rows), GatherArgs(g, x, plan+uint64(pk.Logit), d))
		run(KernelRMSNorm, RowLaunch(rows), RMSNormArgs(gn, g, m.norm, d, eps))
		steps = append(steps, func() error { return m.matmul(ctx, a.logits.DeviceAddr(), gn, rows, m.lmHead) })
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}
