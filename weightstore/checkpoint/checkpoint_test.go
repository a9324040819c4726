package checkpoint

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/fp8"
)

func load(t *testing.T, dir string) *model.Model {
	t.Helper()
	pool := kernels.NewPool(2)
	t.Cleanup(pool.Close)
	m, c, err := LoadModel(dir, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return m
}

// teacherForced returns the logits after every position of tokens.
func teacherForced(t *testing.T, m *model.Model, tokens []int32) [][]float32 {
	t.Helper()
	logits, err := m.Score(tokens)
	if err != nil {
		t.Fatal(err)
	}
	vocab := m.Config().VocabSize
	rows := make([][]float32, len(tokens))
	for i := range rows {
		rows[i] = logits[i*vocab : (i+1)*vocab]
	}
	return rows
}

func TestGoldenFirstStepLogits(t *testing.T) {
	cases, stories := testmodel.Golden(t), testmodel.Dir(t)
	m := load(t, stories)
	for _, c := range cases {
		rows := teacherForced(t, m, c.PromptIDs)
		got := rows[len(rows)-1]
		var worst float64
		for i, want := range c.FirstStepLogits {
			worst = max(worst, math.Abs(float64(got[i]-want)))
		}
		if worst > 1e-4 {
			t.Errorf("%s: first-step logits differ by up to %g", c.Name, worst)
		}
	}
}

func TestGoldenGreedyTeacherForced(t *testing.T) {
	// Every greedy step of the reference, checked in one prefill.
	stories := testmodel.Dir(t)
	for _, c := range testmodel.Golden(t) {
		m := load(t, stories)
		tokens := append(append([]int32{}, c.PromptIDs...), c.Completion...)
		rows := teacherForced(t, m, tokens)
		for i, want := range c.Completion {
			if got := sample.Argmax(rows[len(c.PromptIDs)-1+i]); got != want {
				t.Fatalf("%s: step %d predicts %d, reference %d", c.Name, i, got, want)
			}
		}
	}
}

// dequantized serves an FP8 checkpoint with every FP8 weight expanded to
// F32 by the reference dequantiser, so a model built on it computes what
// the FP8 kernels should.
type dequantized struct{ *Checkpoint }

func (d dequantized) Lookup(name string) (model.Tensor, bool) {
	t, ok := d.Checkpoint.Lookup(name)
	if !ok || t.DType != dtype.F8E4M3 {
		return t, ok
	}
	s, _ := d.Checkpoint.Lookup(strings.TrimSuffix(name, ".weight") + ".weight_scale_inv")
	scales, _ := dtype.ToFloat32(s.DType, s.Data)
	w, err := fp8.DequantizeBlocks(t.Data, scales, t.Shape[0], t.Shape[1], DefaultBlock)
	if err != nil {
		return model.Tensor{}, false
	}
	t.DType = dtype.F32
	t.Data, _ = dtype.FromFloat32(dtype.F32, w)
	return t, true
}

func TestFP8QuantizedStories(t *testing.T) {
	cases, stories := testmodel.Golden(t), testmodel.Dir(t)
	out := filepath.Join(t.TempDir(), "fp8")
	if err := Quantize(context.Background(), stories, out, QuantizeOptions{Block: DefaultBlock}); err != nil {
		t.Fatal(err)
	}
	ref, q := load(t, stories), load(t, out)
	if q.Config().Quantization == nil || q.Weights().Layers[0].Q.DType != dtype.F8E4M3 {
		t.Fatal("quantised checkpoint does not load as FP8")
	}
	if q.Weights().Embed.DType != dtype.F32 || q.Weights().Layers[0].AttnNorm == nil {
		t.Fatal("embeddings did not keep their dtype")
	}
	qc, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer qc.Close()
	pool := kernels.NewPool(1)
	defer pool.Close()
	deq, err := model.New(qc.Config(), dequantized{qc}, pool)
	if err != nil {
		t.Fatal(err)
	}
	// Issue 2's bar on the trained model: every golden case's first-step
	// logits within cosine 0.99 of F32's, and at least 95% of the golden
	// greedy steps, teacher-forced, predicted by FP8 too. (The golden ids
	// are F32's greedy path: TestGoldenGreedyTeacherForced.) Measured on
	// the genuine stories260K: cosines 0.9998, 160 of 164 steps (0.976).
	var agree, total int
	for _, c := range cases {
		tokens := append(append([]int32{}, c.PromptIDs...), c.Completion...)
		a, b, d := teacherForced(t, ref, tokens), teacherForced(t, q, tokens), teacherForced(t, deq, tokens)
		for i := range b {
			for j := range b[i] {
				if diff := math.Abs(float64(b[i][j] - d[i][j])); diff > 1e-4 {
					t.Fatalf("%s position %d logit %d: FP8 kernels %v, dequantised reference %v", c.Name, i, j, b[i][j], d[i][j])
				}
			}
		}
		first := len(c.PromptIDs) - 1
		cos := testmodel.Cosine(a[first], b[first])
		caseAgree := 0
		for i, want := range c.Completion {
			if sample.Argmax(b[first+i]) == want {
				caseAgree++
			}
		}
		agree += caseAgree
		total += len(c.Completion)
		t.Logf("%s: first-step cosine to F32 %.5f, greedy steps kept %d/%d", c.Name, cos, caseAgree, len(c.Completion))
		if cos < 0.99 {
			t.Errorf("%s: first-step cosine to F32 %.5f < 0.99", c.Name, cos)
		}
	}
	rate := float64(agree) / float64(total)
	t.Logf("teacher-forced top-1 agreement with the golden greedy ids: %d/%d = %.3f", agree, total, rate)
	if rate < 0.95 {
		t.Fatalf("FP8 keeps %d of %d golden greedy steps (%.3f), want at least 95%%", agree, total, rate)
	}
}

func TestOpenRejectsBrokenCheckpoints(t *testing.T) {
	stories := testmodel.Dir(t)
	sharded := filepath.Join(t.TempDir(), "sharded")
	if err := reshard(stories, sharded, 300<<10); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadIndex(sharded); err != nil {
		t.Fatalf("resharding did not produce an index: %v", err)
	}
	m := load(t, sharded)
	if m.Config().HiddenSize != 64 {
		t.Fatal("sharded checkpoint loads a different config")
	}
	for _, tc := range []struct {
		name   string
		break_ func(dir string) error
		want   string
	}{
		{"missing shard", func(dir string) error { return os.Remove(filepath.Join(dir, "model-00002-of-00004.safetensors")) },
			"shard model-00002-of-00004.safetensors named in model.safetensors.index.json is missing"},
		{"index points elsewhere", func(dir string) error {
			idx, err := ReadIndex(dir)
			if err != nil {
				return err
			}
			idx.WeightMap["model.norm.weight"] = "model-00001-of-00004.safetensors"
			raw, _ := json.Marshal(idx)
			return os.WriteFile(filepath.Join(dir, IndexFile), raw, 0o644)
		}, "maps tensor model.norm.weight to model-00001-of-00004.safetensors, which does not hold it"},
		{"truncated shard", func(dir string) error {
			return os.Truncate(filepath.Join(dir, "model-00003-of-00004.safetensors"), 1000)
		}, "model-00003-of-00004.safetensors"},
		{"bad config", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{"hidden_size": "wide"}`), 0o644)
		}, "config.json"},
		{"config disagrees", func(dir string) error {
			raw, _ := os.ReadFile(filepath.Join(dir, ConfigFile))
			return os.WriteFile(filepath.Join(dir, ConfigFile), []byte(strings.Replace(string(raw), `"intermediate_size": 172`, `"intermediate_size": 128`, 1)), 0o644)
		}, "config.json implies [128 64]"},
		{"no weights", func(dir string) error {
			for _, f := range []string{IndexFile, "model-00001-of-00004.safetensors"} {
				if err := os.Remove(filepath.Join(dir, f)); err != nil {
					return err
				}
			}
			return nil
		}, "neither model.safetensors nor model.safetensors.index.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			if err := reshard(stories, dir, 300<<10); err != nil {
				t.Fatal(err)
			}
			if err := tc.break_(dir); err != nil {
				t.Fatal(err)
			}
			_, c, err := LoadModel(dir, kernels.NewPool(1))
			if err == nil {
				c.Close()
				t.Fatal("loaded a broken checkpoint")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestWriteRefusesNonEmptyDir(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "x"), nil, 0o644)
	err := Write(context.Background(), dir, nil, WriteOptions{})
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("error %v", err)
	}
}

func TestWriteCancelledLeavesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	parent := t.TempDir()
	dir := filepath.Join(parent, "out")
	entries := []Entry{{Name: "a", DType: dtype.F32, Shape: []int{2}, Bytes: func() ([]byte, error) { return make([]byte, 8), nil }}}
	if err := Write(ctx, dir, entries, WriteOptions{}); err == nil {
		t.Fatal("cancelled write succeeded")
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 0 {
		t.Fatalf("cancelled write left %v", ents)
	}
}

// reshard copies a checkpoint into shards of at most shardSize bytes.
func reshard(in, out string, shardSize int64) error {
	c, err := Open(in)
	if err != nil {
		return err
	}
	defer c.Close()
	var entries []Entry
	for _, ns := range c.config.TensorShapes() {
		t, _ := c.Lookup(ns.Name)
		entries = append(entries, Entry{Name: ns.Name, DType: t.DType, Shape: t.Shape, Bytes: func() ([]byte, error) { return t.Data, nil }})
	}
	files, err := siblingFiles(in)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(filepath.Join(in, ConfigFile))
	if err != nil {
		return err
	}
	files[ConfigFile] = raw
	return Write(context.Background(), out, entries, WriteOptions{ShardSize: shardSize, Files: files})
}
