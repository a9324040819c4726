package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/weightstore/gguf"
)

func TestExportGGUF(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tiny")
	if out, err := stoke(t, "model", "synth", "--preset", "tiny", "--out", src, "--seed", "3"); err != nil {
		t.Fatalf("synth: %v\n%s", err, out)
	}
	for _, typ := range []string{"q8_0", "f16"} {
		out := filepath.Join(dir, typ+".gguf")
		if msg, err := stoke(t, "model", "export-gguf", "--type", typ, src, out); err != nil {
			t.Fatalf("export-gguf --type %s: %v\n%s", typ, err, msg)
		}
		g, err := gguf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		arch, _ := g.Get("general.architecture")
		q, ok := g.Tensor("blk.0.attn_q.weight")
		g.Close()
		want := map[string]gguf.TensorType{"q8_0": gguf.TensorQ8_0, "f16": gguf.TensorF16}[typ]
		if arch != "llama" || !ok || q.Type != want {
			t.Fatalf("--type %s: architecture %v, attn_q %+v", typ, arch, q)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"one argument", []string{"model", "export-gguf", src}, "accepts 2 arg(s), received 1"},
		{"bad type", []string{"model", "export-gguf", "--type", "q4_0", src, filepath.Join(dir, "x.gguf")}, `weight type "q4_0" is not one of`},
		{"missing source", []string{"model", "export-gguf", filepath.Join(dir, "nope"), filepath.Join(dir, "x.gguf")}, "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := stoke(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q, want one line containing %q", err, tc.want)
			}
		})
	}
}
