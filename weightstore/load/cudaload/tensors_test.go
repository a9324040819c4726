package cudaload

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/cudaexec"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/synth"
)

// hostMem is Memory over host bytes, standing in for a file the loader
// put in device memory.
type hostMem []byte

func (m hostMem) DeviceAddr() uint64 { return 1 << 40 }

func (m hostMem) CopyOut(dst []byte, off int64) error {
	if off < 0 || off+int64(len(dst)) > int64(len(m)) {
		return fmt.Errorf("copy out %d bytes at %d of %d", len(dst), off, len(m))
	}
	copy(dst, m[off:])
	return nil
}

// TestTensorsIndexDeviceFiles indexes a sharded synthetic FP8 checkpoint
// from (host-backed) device memory, resolves the GPU model's weights over
// it and checks every tensor points at the bytes the CPU checkpoint
// reader finds.
func TestTensorsIndexDeviceFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	if err := synth.Write(context.Background(), dir, synth.Options{Preset: "tiny", DType: dtype.F8E4M3, Seed: 3, ShardSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".safetensors") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, File{Name: e.Name(), Size: int64(len(b)), Mem: hostMem(b)})
	}
	if len(files) < 2 {
		t.Fatalf("%d shards: want a sharded checkpoint", len(files))
	}
	tensors, err := Tensors(files)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cfg := ck.Config()
	if _, err := cudaexec.ResolveWeights(&cfg, tensors); err != nil {
		t.Fatal(err)
	}
	for _, name := range ck.Names() {
		want, _ := ck.Lookup(name)
		got, ok := tensors[name]
		if !ok {
			t.Fatalf("tensor %s is not indexed", name)
		}
		b := make([]byte, got.Size())
		if err := got.Mem.CopyOut(b, got.Off); err != nil {
			t.Fatal(err)
		}
		if got.DType != want.DType || !bytes.Equal(b, want.Data) {
			t.Errorf("tensor %s: %v bytes differ from the checkpoint's %v", name, got.DType, want.DType)
		}
	}
	files[0].Size = 4
	if _, err := Tensors(files); err == nil {
		t.Error("a 4-byte weight file was indexed")
	}
}

func TestParseDevice(t *testing.T) {
	for in, want := range map[string]int{"cuda": 0, "cuda:3": 3} {
		if got, err := ParseDevice(in); err != nil || got != want {
			t.Errorf("ParseDevice(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"gpu", "cuda:", "cuda:-1", "cuda:x"} {
		if _, err := ParseDevice(in); err == nil {
			t.Errorf("ParseDevice(%q) accepted", in)
		}
	}
}
