package watch

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/synth"
)

// TestValidateAgainstConfig: checkpoints whose headers parse but which the
// engine could not load (a config.json that disagrees with the tensors'
// shapes, a tokenizer that does not build or does not fit the vocabulary, a
// chat template that does not compile) are recorded as failed, with a
// reason naming the problem, instead of ready.
func TestValidateAgainstConfig(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		file    string
		mutate  func(t *testing.T, doc map[string]any)
		reasons []string
	}{
		{
			name: "valid", file: "config.json",
			mutate: func(t *testing.T, doc map[string]any) {},
		},
		{
			name: "hidden_size 1e9", file: "config.json",
			mutate: func(t *testing.T, doc map[string]any) {
				doc["hidden_size"] = 1_000_000_000
				delete(doc, "head_dim")
			},
			reasons: []string{"model.embed_tokens.weight", "shape", "hidden_size 1000000000"},
		},
		{
			name: "num_hidden_layers 1e6", file: "config.json",
			mutate: func(t *testing.T, doc map[string]any) {
				doc["num_hidden_layers"] = 1_000_000
			},
			reasons: []string{"num_hidden_layers 1000000", "layers"},
		},
		{
			name: "intermediate_size off", file: "config.json",
			mutate: func(t *testing.T, doc map[string]any) {
				doc["intermediate_size"] = doc["intermediate_size"].(float64) + 2
			},
			reasons: []string{"mlp.gate_proj.weight", "shape"},
		},
		{
			name: "bad regex", file: "tokenizer.json",
			mutate: func(t *testing.T, doc map[string]any) {
				pre := doc["pre_tokenizer"].(map[string]any)
				split := pre["pretokenizers"].([]any)[0].(map[string]any)
				split["pattern"] = map[string]any{"Regex": "(?<open[a-z"}
			},
			reasons: []string{"tokenizer", "pre_tokenizer", "regex"},
		},
		{
			name: "added token id out of range", file: "tokenizer.json",
			mutate: func(t *testing.T, doc map[string]any) {
				model := doc["model"].(map[string]any)
				vocab := len(model["vocab"].(map[string]any))
				added := doc["added_tokens"].([]any)
				doc["added_tokens"] = append(added, map[string]any{"id": vocab + len(added) + 40, "content": "<|stray|>",
					"single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
			},
			reasons: []string{"tokenizer", "<|stray|>", "vocab_size"},
		},
		{
			name: "invalid merges", file: "tokenizer.json",
			mutate: func(t *testing.T, doc map[string]any) {
				model := doc["model"].(map[string]any)
				model["merges"] = append([]any{"qqqzzz xxxyyy"}, model["merges"].([]any)...)
			},
			reasons: []string{"tokenizer", "model.merges", "not in model.vocab"},
		},
		{
			name: "chat template does not compile", file: "tokenizer_config.json",
			mutate: func(t *testing.T, doc map[string]any) {
				doc["chat_template"] = "{% for message in messages %}{{ message['content'] }"
			},
			reasons: []string{"tokenizer", "chat_template", "does not compile"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			copyDir(t, src, dir)
			editJSON(t, filepath.Join(dir, tt.file), func(doc map[string]any) { tt.mutate(t, doc) })

			e := newFileEnv(t)
			e.uploadDir(t, "m", dir)
			e.scan(t)
			e.clock.Advance(testQuiet)
			e.scan(t)
			want := store.RevisionFailed
			if tt.reasons == nil {
				want = store.RevisionReady
			}
			r := checkOne(t, e, "m", "", want, tt.reasons...)
			t.Logf("reason: %s", r.Reason)
			if ev := e.events.list(); len(ev) != 1 || ev[0].State != want {
				t.Errorf("events = %+v, want one %s", ev, want)
			}
		})
	}
}

// copyDir copies the plain files of src into a new directory dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range ents {
		data, err := os.ReadFile(filepath.Join(src, ent.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, ent.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// editJSON rewrites the JSON object in path through edit.
func editJSON(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	edit(doc)
	if data, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
