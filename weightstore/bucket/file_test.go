package bucket_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/weightstore/bucket"
)

// TestFileStaysInRoot is issue 13's finding 6: a symbolic link (absolute or
// relative) or a directory link leading out of a file:// bucket is refused
// on read, stat and put, and left out of listings; a relative link within
// the bucket still works.
func TestFileStaysInRoot(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("root:x:0:0"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	b := mustOpen(t, "file://"+root, bucket.S3Options{})
	put(t, b, "m/model.safetensors", []byte("weights"))
	put(t, b, "shared/config.json", []byte("{}"))
	links := map[string]string{
		"m/config.json": secret,                                       // absolute, out
		"m/rel.json":    "../../outside/secret",                       // relative, out
		"m/abs-in.json": filepath.Join(root, "shared", "config.json"), // absolute: refused too
		"m/inside.json": "../shared/config.json",                      // relative, in: fine
		"out":           outside,                                      // a directory link out
	}
	for key, target := range links {
		if err := os.Symlink(target, filepath.Join(root, filepath.FromSlash(key))); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"m/config.json", "m/rel.json", "m/abs-in.json", "out/secret"} {
		data, err := read(t, b, key, 0, -1)
		if !errors.Is(err, bucket.ErrOutsideRoot) || !strings.Contains(err.Error(), key) {
			t.Errorf("ReadRange(%s) = %q, %v; want ErrOutsideRoot naming the key", key, data, err)
		}
		if _, err := b.Stat(ctx, key); !errors.Is(err, bucket.ErrOutsideRoot) || !strings.Contains(err.Error(), key) {
			t.Errorf("Stat(%s) = %v; want ErrOutsideRoot naming the key", key, err)
		}
	}
	if err := b.Put(ctx, "out/planted", bytes.NewReader([]byte("x")), 1); !errors.Is(err, bucket.ErrOutsideRoot) {
		t.Errorf("Put(out/planted) = %v, want ErrOutsideRoot", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Error("Put wrote through a directory link out of the root")
	}
	if data, err := read(t, b, "m/inside.json", 0, -1); err != nil || string(data) != "{}" {
		t.Errorf("ReadRange(m/inside.json) = %q, %v; want the linked file within the root", data, err)
	}
	for _, prefix := range []string{"", "m/", "m/c"} {
		objs, err := b.List(ctx, prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		for _, k := range keys(objs) {
			if k == "m/config.json" || k == "m/rel.json" || k == "m/abs-in.json" || strings.HasPrefix(k, "out/") {
				t.Errorf("List(%q) has %s, which leads out of the root", prefix, k)
			}
		}
	}
	objs, err := b.List(ctx, "m/")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keys(objs), []string{"m/inside.json", "m/model.safetensors"}; !slices.Equal(got, want) {
		t.Errorf("List(m/) = %q, want %q", got, want)
	}
	if _, err := b.List(ctx, "out/"); !errors.Is(err, bucket.ErrOutsideRoot) {
		t.Errorf("List(out/) = %v, want ErrOutsideRoot", err)
	}
	// Deleting a link removes the link, never its target.
	if err := b.Delete(ctx, "m/config.json"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Errorf("Delete removed the link's target: %v", err)
	}
}

// TestFileListSkipsHidden: hidden names (a path element starting with '.')
// are not listed, at the top (".hidden/", "..x/") or deeper.
func TestFileListSkipsHidden(t *testing.T) {
	ctx := context.Background()
	b := mustOpen(t, "file://"+filepath.Join(t.TempDir(), "root"), bucket.S3Options{})
	for _, key := range []string{
		".hidden/config.json", "..x/config.json", "...y/z", ".top",
		"m/.cache/blob", "m/.DS_Store", "m/config.json", "m/a.b/c",
	} {
		put(t, b, key, []byte("x"))
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"m/a.b/c", "m/config.json"}},
		{".hidden/", nil},
		{"..x/", nil},
		{"m/", []string{"m/a.b/c", "m/config.json"}},
		{"m/.c", nil},
	} {
		objs, err := b.List(ctx, tc.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tc.prefix, err)
		}
		if got := keys(objs); !slices.Equal(got, tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	// Hidden keys stay readable by name.
	if data, err := read(t, b, ".hidden/config.json", 0, -1); err != nil || string(data) != "x" {
		t.Errorf("ReadRange(.hidden/config.json) = %q, %v", data, err)
	}
}
