package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/synth"
)

func TestPushCLI(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	ep, ak, sk := bucketest.StartMinIO(t)
	bucketest.MakeBucket(t, ep, ak, sk, "models")
	t.Setenv("AWS_ACCESS_KEY_ID", ak)
	t.Setenv("AWS_SECRET_ACCESS_KEY", sk)
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1") // overridden by --endpoint
	root := t.TempDir()

	tests := []struct {
		name string
		args []string
	}{
		{"file", []string{"push", src, "file://" + filepath.Join(root, "tiny")}},
		{"file fp8 resharded", []string{"push", src, "file://" + filepath.Join(root, "tiny-fp8"), "--quantize", "fp8", "--shard-size", "64KiB", "--parallel", "2"}},
		{"minio", []string{"push", src, "s3://models/tiny", "--endpoint", ep, "--path-style", "--region", "us-east-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := stoke(t, tc.args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			rev := lines[len(lines)-1]
			if !strings.HasPrefix(rev, manifest.RevisionPrefix) || len(rev) != len(manifest.RevisionPrefix)+64 {
				t.Fatalf("last line %q is not a revision; output:\n%s", rev, out)
			}
			if !strings.Contains(out, "uploaded config.json") {
				t.Errorf("no progress in the output:\n%s", out)
			}
			if strings.HasPrefix(tc.args[2], "file://") {
				data, err := os.ReadFile(filepath.Join(strings.TrimPrefix(tc.args[2], "file://"), manifest.FileName))
				if err != nil {
					t.Fatal(err)
				}
				m, err := manifest.Parse(data)
				if err != nil {
					t.Fatal(err)
				}
				if m.Revision != rev {
					t.Errorf("manifest revision %s, printed %s", m.Revision, rev)
				}
			}
			// Again: the same revision, nothing uploaded.
			out2, err := stoke(t, tc.args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out2)
			}
			if !strings.HasSuffix(strings.TrimSpace(out2), rev) || strings.Contains(out2, "uploaded") {
				t.Errorf("second push output:\n%s\nwant only the revision %s", out2, rev)
			}
		})
	}
}

func TestPushCLIErrors(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(t.TempDir(), "broken")
	if err := os.Mkdir(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	dest := "file://" + filepath.Join(t.TempDir(), "tiny")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unsupported scheme", []string{"push", src, "ftp://host/models/tiny"}, "unsupported scheme"},
		{"no bucket name", []string{"push", src, "s3:///tiny"}, "no bucket name"},
		{"missing parent directory", []string{"push", src, "file:///nonexistent-stoke-dir/sub/tiny"}, "bucket does not exist"},
		{"root as destination", []string{"push", src, "file:///"}, "model name"},
		{"bad quantize", []string{"push", src, dest, "--quantize", "int4"}, "--quantize"},
		{"bad shard size", []string{"push", src, dest, "--shard-size", "lots"}, "--shard-size"},
		{"bad parallel", []string{"push", src, dest, "--parallel", "0"}, "--parallel"},
		{"one argument", []string{"push", src}, "accepts 2 arg"},
		{"broken checkpoint", []string{"push", broken, dest}, "refusing a broken checkpoint"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := stoke(t, tc.args...)
			if err == nil {
				t.Fatalf("stoke %v succeeded:\n%s", tc.args, out)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line mentioning %q", err, tc.want)
			}
		})
	}
}
