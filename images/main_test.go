package images

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// moduleRoot is the repository root, relative to this package.
const moduleRoot = ".."

// builtBinary is a binary the package's tests compile at most once.
type builtBinary struct {
	once sync.Once
	path string
	err  error
}

// testBins holds the binaries the tests build, and the images of the
// stoke binary, in a directory removed when they end.
var testBins struct {
	dir         string
	stoke, tiny builtBinary
	stokeImages struct {
		once sync.Once
		res  Result
		err  error
	}
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "stoke-images-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "directory for test binaries:", err)
		os.Exit(1)
	}
	testBins.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// stokeBinary returns a static stoke binary built from this tree, compiled
// once per test run.
func stokeBinary(t testing.TB) string {
	t.Helper()
	b := &testBins.stoke
	b.once.Do(func() {
		b.path = filepath.Join(testBins.dir, "stoke")
		b.err = goBuild(context.Background(), moduleRoot, DefaultPackage, DefaultArch, b.path)
	})
	if b.err != nil {
		t.Fatalf("build the stoke binary: %v", b.err)
	}
	return b.path
}

// tinyBinary returns a static Go program that does nothing, a megabyte
// instead of stoke's sixty, for tests about the images' form rather than
// what runs in them.
func tinyBinary(t testing.TB) string {
	t.Helper()
	b := &testBins.tiny
	b.once.Do(func() {
		src := filepath.Join(testBins.dir, "tiny-src")
		if b.err = os.MkdirAll(src, 0o755); b.err != nil {
			return
		}
		for name, content := range map[string]string{
			"go.mod":  "module tiny\n\ngo 1.26\n",
			"main.go": "package main\n\nfunc main() {}\n",
		} {
			if b.err = os.WriteFile(filepath.Join(src, name), []byte(content), 0o644); b.err != nil {
				return
			}
		}
		b.path = filepath.Join(testBins.dir, "tiny")
		b.err = goBuild(context.Background(), src, ".", DefaultArch, b.path)
	})
	if b.err != nil {
		t.Fatalf("build a tiny static binary: %v", b.err)
	}
	return b.path
}

// stokeImages returns the images of stokeBinary with the default options,
// built once for the tests that only read them.
func stokeImages(t testing.TB) Result {
	t.Helper()
	bin := stokeBinary(t)
	im := &testBins.stokeImages
	im.once.Do(func() {
		im.res, im.err = Build(context.Background(), Options{Binary: bin, Out: filepath.Join(testBins.dir, "stoke-images")})
	})
	if im.err != nil {
		t.Fatalf("Build the stoke images: %v", im.err)
	}
	return im.res
}

// buildImages builds both images into a new directory, from the tiny
// binary unless opts name one.
func buildImages(t testing.TB, opts Options) Result {
	t.Helper()
	if opts.Binary == "" {
		opts.Binary = tinyBinary(t)
	}
	if opts.Out == "" {
		opts.Out = t.TempDir()
	}
	res, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	for _, name := range []string{StokeImage, EngineImage} {
		if res.Archives[name] == "" || res.Digests[name] == "" || res.Refs[name] == "" {
			t.Fatalf("Build result lacks image %s: %+v", name, res)
		}
	}
	return res
}

// describe names an image of a result in failure messages.
func describe(res Result, name string) string {
	return fmt.Sprintf("%s (%s, %s)", res.Refs[name], res.Digests[name], res.Archives[name])
}
