package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stokehq/stoke/internal/store/pgtest"
	"github.com/stokehq/stoke/internal/testmodel"
)

// stoke runs the CLI in-process and returns its standard output.
func stoke(t testing.TB, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := newRootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestGenerateMatchesGolden(t *testing.T) {
	cases := testmodel.Golden(t)
	stories := testmodel.Dir(t)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			ids := make([]string, len(c.PromptIDs))
			for i, id := range c.PromptIDs {
				ids[i] = strconv.Itoa(int(id))
			}
			out, err := stoke(t, "generate", "--model", stories, "--prompt-ids", strings.Join(ids, ","),
				"--max-tokens", strconv.Itoa(len(c.Completion)), "--temperature", "0", "--ignore-eos", "--json")
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var res generateOutput
			if err := json.Unmarshal([]byte(out), &res); err != nil {
				t.Fatalf("output is not one JSON object: %v\n%s", err, out)
			}
			if !slices.Equal(res.IDs, c.Completion) {
				t.Fatalf("ids %v\nwant %v", res.IDs, c.Completion)
			}
			if !slices.Equal(res.PromptIDs, c.PromptIDs) || res.TokensPerSecond <= 0 {
				t.Fatalf("prompt_ids %v, tokens_per_second %v", res.PromptIDs, res.TokensPerSecond)
			}
		})
	}
}

func TestSynthQuantizeGenerate(t *testing.T) {
	dir := t.TempDir()
	f32, fp8 := filepath.Join(dir, "f32"), filepath.Join(dir, "fp8")
	if out, err := stoke(t, "model", "synth", "--preset", "tiny", "--out", f32, "--seed", "5", "--shard-size", "64KiB"); err != nil {
		t.Fatalf("synth: %v\n%s", err, out)
	}
	if out, err := stoke(t, "model", "quantize", "--in", f32, "--out", fp8, "--shard-size", "0"); err != nil {
		t.Fatalf("quantize: %v\n%s", err, out)
	}
	for _, m := range []string{f32, fp8} {
		out, err := stoke(t, "generate", "--model", m, "--prompt", "Once upon a time", "--max-tokens", "12",
			"--temperature", "0.8", "--seed", "3", "--ignore-eos", "--json")
		if err != nil {
			t.Fatalf("generate on %s: %v\n%s", m, err, out)
		}
		var res generateOutput
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		if len(res.IDs) != 12 || len(res.PromptIDs) < 2 || !utf8.ValidString(res.Text) {
			t.Fatalf("generate on %s: %+v", m, res)
		}
	}
}

// TestGenerateTellsTheStory runs `stoke generate` on the trained
// stories260K through its tokenizer: greedy from BOS it prints the model's
// well-known story, and a text prompt is tokenized as the reference
// tokenized the golden "once" case and continues it with the golden ids.
func TestGenerateTellsTheStory(t *testing.T) {
	stories := testmodel.Dir(t)
	t.Run("from BOS", func(t *testing.T) {
		bos := testmodel.GoldenCase(t, "bos")
		out, err := stoke(t, "generate", "--model", stories, "--prompt-ids", "1",
			"--max-tokens", strconv.Itoa(len(bos.Completion)), "--temperature", "0")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if !strings.HasPrefix(out, testmodel.StoryStart) {
			t.Fatalf("printed %q, want it to start %q", out, testmodel.StoryStart)
		}
	})
	t.Run("text prompt", func(t *testing.T) {
		once := testmodel.GoldenCase(t, "once")
		out, err := stoke(t, "generate", "--model", stories, "--prompt", "Once upon a time",
			"--max-tokens", strconv.Itoa(len(once.Completion)), "--temperature", "0", "--ignore-eos", "--json")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var res generateOutput
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("output is not one JSON object: %v\n%s", err, out)
		}
		if !slices.Equal(res.PromptIDs, once.PromptIDs) || !slices.Equal(res.IDs, once.Completion) {
			t.Fatalf("prompt_ids %v, ids %v; want %v, %v", res.PromptIDs, res.IDs, once.PromptIDs, once.Completion)
		}
		if want := strings.TrimPrefix(testmodel.StoryStart, "Once upon a time"); !strings.HasPrefix(res.Text, want) {
			t.Fatalf("text %q, want it to start %q", res.Text, want)
		}
	})
}

func TestCLIErrors(t *testing.T) {
	// Arguments name the model as stories (the shared checkpoint) or bare
	// (a copy of it without its tokenizer); both are made only for the
	// cases that use them.
	const stories, bare = "<stories>", "<bare>"
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no prompt", []string{"generate", "--model", stories}, "exactly one of --prompt and --prompt-ids"},
		{"bad ids", []string{"generate", "--model", stories, "--prompt-ids", "1,x"}, `"x" is not a token id`},
		{"text without tokenizer", []string{"generate", "--model", bare, "--prompt", "hi"}, "has no tokenizer.json"},
		{"id outside vocab", []string{"generate", "--model", stories, "--prompt-ids", "1,600"}, "token 600 is outside the vocabulary"},
		{"missing model", []string{"generate", "--model", filepath.Join(dir, "nope"), "--prompt-ids", "1"}, "nope"},
		{"too long", []string{"generate", "--model", stories, "--prompt-ids", "1", "--max-tokens", "600"}, "exceeds the context of 512"},
		{"bad preset", []string{"model", "synth", "--preset", "huge", "--out", filepath.Join(dir, "m")}, `unknown preset "huge"`},
		{"bad dtype", []string{"model", "synth", "--dtype", "int4", "--out", filepath.Join(dir, "m")}, `unknown dtype "int4"`},
		{"bad shard size", []string{"model", "quantize", "--in", stories, "--out", filepath.Join(dir, "q"), "--shard-size", "lots"}, "--shard-size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := slices.Clone(tc.args)
			for i, a := range args {
				switch a {
				case stories:
					args[i] = testmodel.Dir(t)
				case bare:
					args[i] = testmodel.WithoutTokenizer(t)
				}
			}
			_, err := stoke(t, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q, want one line containing %q", err, tc.want)
			}
		})
	}
}

// runMainEnv makes the test binary run stoke's main instead of the tests,
// so tests can start stoke as a separate process (and kill it).
const runMainEnv = "STOKE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Args = append([]string{"stoke"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	pgtest.Main(m) // runs the tests, then stops the PostgreSQL server they shared
}
