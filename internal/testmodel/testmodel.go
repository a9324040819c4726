// Package testmodel gives tests the project's shared real checkpoint,
// stories260K (a trained 260K-parameter Llama in Hugging Face layout), and
// the greedy completions a reference implementation produced for it. Both
// live in the shared folder beside the repository, never in it; tests that
// need them skip when it is absent, so a fresh clone passes on its own.
package testmodel

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// Case is one golden prompt: its token ids, the reference's greedy
// completion and its logits after the prompt.
type Case struct {
	Name            string    `json:"name"`
	PromptIDs       []int32   `json:"prompt_ids"`
	Completion      []int32   `json:"greedy_completion_ids"`
	FirstStepLogits []float32 `json:"first_step_logits"`
}

// Path returns where the checkpoint's directory is expected: the shared
// folder beside the root of the module that holds the working directory.
func Path() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "..", "shared", "models", "stories260K")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Dir returns the checkpoint's directory, or skips t when it is absent.
func Dir(t testing.TB) string {
	t.Helper()
	dir := Path()
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Skipf("test model absent: %s", dir)
	}
	return dir
}

// Golden returns the golden cases, or skips t when they are absent.
func Golden(t testing.TB) []Case {
	t.Helper()
	path := filepath.Join(Dir(t), "golden.json")
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		t.Skipf("golden outputs absent: %s", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []Case `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return g.Cases
}

// Cosine returns the cosine similarity of a and b, summed in float64: how
// the FP8 checks compare weights and logits with their F32 originals.
func Cosine(a, b []float32) float64 {
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	return dot / math.Sqrt(na*nb)
}
