package testmodel

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how a helper ended the test
// instead of ending the real one.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmtArgs(format, args)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmtArgs(format, args)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) {
	r.failed, r.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}

func fmtArgs(format string, args []any) string {
	return fmt.Sprintf(format, args...)
}

// run calls f with a recorder on its own goroutine, as the testing package
// runs a test, so that Skipf and Fatalf can stop it.
func run(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func TestAbsentSkipsUnlessRequired(t *testing.T) {
	present := t.TempDir()
	if err := os.WriteFile(filepath.Join(present, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "nope")
	for _, tc := range []struct {
		name, env, dir string
		wantSkip       bool
		wantFail       bool
	}{
		{"absent, not required", "", missing, true, false},
		{"absent, required", "1", missing, false, true},
		{"absent, other value", "0", missing, true, false},
		{"present, required", "1", present, false, false},
		{"present, not required", "", present, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(RequireEnv, tc.env)
			var got string
			r := run(t, func(tb testing.TB) { got = dirAt(tb, tc.dir) })
			if r.skipped != tc.wantSkip || r.failed != tc.wantFail {
				t.Fatalf("skipped %v, failed %v (%q); want skipped %v, failed %v", r.skipped, r.failed, r.msg, tc.wantSkip, tc.wantFail)
			}
			if !tc.wantSkip && !tc.wantFail && got != tc.dir {
				t.Fatalf("dirAt = %q, want %q", got, tc.dir)
			}
			if (tc.wantSkip || tc.wantFail) && !strings.Contains(r.msg, tc.dir) {
				t.Fatalf("message %q does not name %s", r.msg, tc.dir)
			}
			if tc.wantFail && !strings.Contains(r.msg, RequireEnv) {
				t.Fatalf("message %q does not say why absence fails", r.msg)
			}
		})
	}
}

func TestGoldenAbsentOrBroken(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, golden, env  string
		wantSkip, wantFail bool
	}{
		{"absent, not required", "", "", true, false},
		{"absent, required", "", "1", false, true},
		{"malformed", "{", "", false, true},
		{"no cases", `{"cases": []}`, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(RequireEnv, tc.env)
			d := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.golden != "" {
				if err := os.WriteFile(filepath.Join(d, "golden.json"), []byte(tc.golden), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r := run(t, func(tb testing.TB) { goldenAt(tb, d) })
			if r.skipped != tc.wantSkip || r.failed != tc.wantFail {
				t.Fatalf("skipped %v, failed %v (%q); want skipped %v, failed %v", r.skipped, r.failed, r.msg, tc.wantSkip, tc.wantFail)
			}
		})
	}
}

func TestShared(t *testing.T) {
	cases := Golden(t)
	names := map[string]bool{}
	for _, c := range cases {
		names[c.Name] = true
		if len(c.PromptIDs) == 0 || c.PromptIDs[0] != 1 || len(c.Completion) == 0 || len(c.FirstStepLogits) != 512 {
			t.Errorf("case %s: %d prompt ids (first %v), %d completion ids, %d logits", c.Name, len(c.PromptIDs), c.PromptIDs[:min(1, len(c.PromptIDs))], len(c.Completion), len(c.FirstStepLogits))
		}
	}
	if !names["bos"] || GoldenCase(t, "bos").Name != "bos" {
		t.Fatalf("golden cases %v lack bos", names)
	}
	bare := WithoutTokenizer(t)
	for _, name := range []string{"config.json", "model.safetensors"} {
		if _, err := os.Stat(filepath.Join(bare, name)); err != nil {
			t.Errorf("WithoutTokenizer lacks %s: %v", name, err)
		}
	}
	entries, err := os.ReadDir(bare)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if isTokenizerFile(e.Name()) {
			t.Errorf("WithoutTokenizer kept %s", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(Dir(t), "tokenizer.json")); err != nil {
		t.Errorf("the shared checkpoint has no tokenizer: %v", err)
	}
}

func TestCosine(t *testing.T) {
	for _, tc := range []struct {
		a, b []float32
		want float64
	}{
		{[]float32{1, 0}, []float32{2, 0}, 1},
		{[]float32{1, 0}, []float32{0, 3}, 0},
		{[]float32{1, 2}, []float32{-1, -2}, -1},
		{[]float32{3, 4}, []float32{4, 3}, 24.0 / 25},
	} {
		if got := Cosine(tc.a, tc.b); got < tc.want-1e-12 || got > tc.want+1e-12 {
			t.Errorf("Cosine(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
