package manifest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func hexOf(c byte) string { return strings.Repeat(string(c), 64) }

func sample() *Manifest {
	files := []File{
		{Name: "config.json", Size: 512, SHA256: hexOf('a')},
		{Name: "model.safetensors", Size: 1 << 20, SHA256: hexOf('b')},
		{Name: "tokenizer.json", Size: 0, SHA256: hexOf('c')},
	}
	return &Manifest{
		Model:      "tiny",
		Revision:   Revision(files),
		Files:      files,
		TotalBytes: 512 + 1<<20,
		DType:      "BF16",
		Spec:       json.RawMessage(`{"replicas":{"min":0,"max":2}}`),
		CreatedAt:  time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
	}
}

func TestRoundTrip(t *testing.T) {
	for _, withSpec := range []bool{true, false} {
		m := sample()
		if !withSpec {
			m.Spec = nil
		}
		data, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		for _, field := range []string{`"model"`, `"revision"`, `"files"`, `"total_bytes"`, `"dtype"`, `"created_at"`, `"sha256"`, `"size"`, `"name"`} {
			if !strings.Contains(string(data), field) {
				t.Errorf("marshalled manifest lacks %s:\n%s", field, data)
			}
		}
		if strings.Contains(string(data), `"spec"`) != withSpec {
			t.Errorf("spec present = %v, want %v:\n%s", !withSpec, withSpec, data)
		}
		got, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		if got.Model != m.Model || got.Revision != m.Revision || got.TotalBytes != m.TotalBytes ||
			got.DType != m.DType || compact(t, got.Spec) != compact(t, m.Spec) || !got.CreatedAt.Equal(m.CreatedAt) ||
			!slices.Equal(got.Files, m.Files) {
			t.Errorf("round trip changed the manifest:\n got %+v\nwant %+v", got, m)
		}
	}
}

func TestRevision(t *testing.T) {
	m := sample()
	rev := Revision(m.Files)
	if !strings.HasPrefix(rev, RevisionPrefix) || len(rev) != len(RevisionPrefix)+64 {
		t.Fatalf("Revision = %q, want sha256:<64 hex>", rev)
	}
	reversed := slices.Clone(m.Files)
	slices.Reverse(reversed)
	if got := Revision(reversed); got != rev {
		t.Errorf("Revision depends on file order: %s vs %s", got, rev)
	}
	changes := map[string]func(f []File){
		"size":   func(f []File) { f[1].Size++ },
		"sha256": func(f []File) { f[1].SHA256 = hexOf('d') },
		"name":   func(f []File) { f[1].Name = "model2.safetensors" },
		"dropped": func(f []File) {
			f[2] = File{}
		},
	}
	for name, change := range changes {
		f := slices.Clone(m.Files)
		change(f)
		if Revision(f) == rev {
			t.Errorf("changing %s kept the revision %s", name, rev)
		}
	}
	// A name/size boundary shift must not collide: "a" size 12 vs "a1" size 2.
	a := Revision([]File{{Name: "a", Size: 12, SHA256: hexOf('a')}})
	b := Revision([]File{{Name: "a1", Size: 2, SHA256: hexOf('a')}})
	if a == b {
		t.Error("distinct file lists share a revision")
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name   string
		change func(m map[string]any)
		want   string
	}{
		{"not JSON", nil, "parse manifest.json"},
		{"missing model", func(m map[string]any) { delete(m, "model") }, "model: empty name"},
		{"model with slash", func(m map[string]any) { m["model"] = "a/b" }, "model:"},
		{"model dot-dot", func(m map[string]any) { m["model"] = ".." }, "model:"},
		{"no files", func(m map[string]any) { m["files"] = []any{} }, "files: empty"},
		{"file name with slash", func(m map[string]any) { file(m, 0)["name"] = "sub/config.json" }, "files[0].name"},
		{"file name empty", func(m map[string]any) { file(m, 0)["name"] = "" }, "files[0].name"},
		{"file name control char", func(m map[string]any) { file(m, 0)["name"] = "a\nb" }, "files[0].name"},
		{"file name backslash", func(m map[string]any) { file(m, 0)["name"] = `a\b` }, "files[0].name"},
		{"file is the manifest", func(m map[string]any) { file(m, 2)["name"] = FileName }, "files[2].name"},
		{"duplicate file", func(m map[string]any) { file(m, 2)["name"] = "config.json" }, "files[2].name: \"config.json\" duplicates files[0]"},
		{"negative size", func(m map[string]any) { file(m, 1)["size"] = -1 }, "files[1].size"},
		{"size not a number", func(m map[string]any) { file(m, 1)["size"] = "big" }, "parse manifest.json"},
		{"short sha256", func(m map[string]any) { file(m, 1)["sha256"] = "abc" }, "files[1].sha256"},
		{"uppercase sha256", func(m map[string]any) { file(m, 1)["sha256"] = hexOf('A') }, "files[1].sha256"},
		{"non-hex sha256", func(m map[string]any) { file(m, 1)["sha256"] = hexOf('g') }, "files[1].sha256"},
		{"wrong total", func(m map[string]any) { m["total_bytes"] = 1 }, "total_bytes"},
		{"revision without prefix", func(m map[string]any) { m["revision"] = hexOf('a') }, "revision:"},
		{"revision not hex", func(m map[string]any) { m["revision"] = "sha256:xyz" }, "revision:"},
		{"revision mismatch", func(m map[string]any) { m["revision"] = "sha256:" + hexOf('a') }, "does not match the files"},
		{"content changed under revision", func(m map[string]any) { file(m, 0)["sha256"] = hexOf('e') }, "revision:"},
		{"unknown dtype", func(m map[string]any) { m["dtype"] = "F7" }, "dtype:"},
		{"missing dtype", func(m map[string]any) { delete(m, "dtype") }, "dtype:"},
		{"spec not an object", func(m map[string]any) { m["spec"] = []int{1} }, "spec:"},
		{"missing created_at", func(m map[string]any) { delete(m, "created_at") }, "created_at"},
		{"bad created_at", func(m map[string]any) { m["created_at"] = "yesterday" }, "parse manifest.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte("{not json")
			if tc.change != nil {
				good, err := sample().Marshal()
				if err != nil {
					t.Fatal(err)
				}
				var m map[string]any
				if err := json.Unmarshal(good, &m); err != nil {
					t.Fatal(err)
				}
				tc.change(m)
				if data, err = json.Marshal(m); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Parse(data)
			if err == nil {
				t.Fatalf("Parse accepted %s", data)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func file(m map[string]any, i int) map[string]any {
	return m["files"].([]any)[i].(map[string]any)
}

func TestMarshalRefusesInvalid(t *testing.T) {
	m := sample()
	m.Files[0].Size = 7
	if _, err := m.Marshal(); err == nil || !strings.Contains(err.Error(), "total_bytes") {
		t.Errorf("Marshal of a manifest with a stale total: err = %v, want a total_bytes error", err)
	}
}

func TestCheckName(t *testing.T) {
	for name, ok := range map[string]bool{
		"config.json": true, "model-00001-of-00002.safetensors": true, "stoke.yaml": true, ".hidden": true,
		"": false, ".": false, "..": false, "a/b": false, "/abs": false, "nul\x00": false, "tab\t": false,
	} {
		if err := CheckName(name); (err == nil) != ok {
			t.Errorf("CheckName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestHash(t *testing.T) {
	cases := []struct {
		name, content, sum string
	}{
		{"empty", "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, sum, err := Hash(context.Background(), strings.NewReader(tc.content))
			if err != nil || n != int64(len(tc.content)) || sum != tc.sum {
				t.Fatalf("Hash = %d, %s, %v; want %d, %s", n, sum, err, len(tc.content), tc.sum)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := Hash(ctx, strings.NewReader("abc")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Hash after cancel: %v, want context.Canceled", err)
	}
}
