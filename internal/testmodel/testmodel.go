// Package testmodel gives tests the project's shared real checkpoint,
// stories260K (a trained 260K-parameter Llama in Hugging Face layout, with
// its tokenizer), and the greedy completions a reference implementation
// produced for it. Both live in the shared folder beside the repository,
// never in it. Tests that need them skip when it is absent, so a fresh clone
// passes on its own, unless STOKE_REQUIRE_SHARED=1 (which CI sets) makes
// its absence a failure.
package testmodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RequireEnv names the environment variable that, set to 1, makes a
// missing shared folder fail the tests that need it instead of skipping
// them: CI (.ci/run) always has the folder, so a skip there would hide a
// broken set-up.
const RequireEnv = "STOKE_REQUIRE_SHARED"

// StoryStart is how the checkpoint's text begins when it decodes greedily
// from BOS alone (the model's well-known story, as llama2.c's run.c prints
// it); the golden "bos" case holds the same completion as ids.
const StoryStart = "Once upon a time, there was a little girl named Lily"

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

// Dir returns the checkpoint's directory. When it is absent t is skipped,
// or fails with STOKE_REQUIRE_SHARED=1.
func Dir(t testing.TB) string {
	t.Helper()
	return dirAt(t, Path())
}

func dirAt(t testing.TB, dir string) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		Absent(t, "test model absent: %s", dir)
	}
	return dir
}

// Absent ends a test that cannot run without the shared folder: it skips
// t, or fails it when STOKE_REQUIRE_SHARED=1.
func Absent(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf(format+" (%s=1 requires the shared folder)", append(args, RequireEnv)...)
	}
	t.Skipf(format, args...)
}

// Golden returns the golden cases. When they are absent t is skipped, or
// fails with STOKE_REQUIRE_SHARED=1.
func Golden(t testing.TB) []Case {
	t.Helper()
	return goldenAt(t, Dir(t))
}

func goldenAt(t testing.TB, dir string) []Case {
	t.Helper()
	path := filepath.Join(dir, "golden.json")
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		Absent(t, "golden outputs absent: %s", path)
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
	if len(g.Cases) == 0 {
		t.Fatalf("%s holds no cases", path)
	}
	return g.Cases
}

// GoldenCase returns the golden case called name, failing t when there is none.
func GoldenCase(t testing.TB, name string) Case {
	t.Helper()
	for _, c := range Golden(t) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no golden case %q", name)
	return Case{}
}

// isTokenizerFile reports whether a checkpoint file belongs to its
// tokenizer rather than to its weights or configuration.
func isTokenizerFile(name string) bool {
	return strings.HasPrefix(name, "tokenizer") || name == "chat_template.jinja" || name == "special_tokens_map.json"
}

// WithoutTokenizer returns a copy of the checkpoint's directory, under
// t.TempDir(), that holds everything but the tokenizer's files: for tests
// of what a model without a tokenizer does. It is skipped or fails as Dir
// does when the checkpoint is absent.
func WithoutTokenizer(t testing.TB) string {
	t.Helper()
	src := Dir(t)
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := copyDir(src, dst, func(name string) bool { return !isTokenizerFile(name) }); err != nil {
		t.Fatal(err)
	}
	return dst
}

// copyDir copies the regular files of src that keep accepts into a new
// directory dst.
func copyDir(src, dst string, keep func(name string) bool) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("copy checkpoint: %w", err)
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("copy checkpoint: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !keep(e.Name()) {
			continue
		}
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return fmt.Errorf("copy checkpoint: %w", err)
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
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
