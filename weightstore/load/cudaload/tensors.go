// Package cudaload serves checkpoints on a CUDA GPU: the streaming loader
// moves a revision's safetensors files into device memory (through pinned
// staging, T2 from the node cache or T3 from the bucket) and the GPU
// model (engine/cudaexec) computes on them in place; a checkpoint
// directory is uploaded tensor by tensor. Engines run on the engine's own
// scheduler, KV manager and server.
//
// Without -tags cuda, Checkpoint reports that the binary has no CUDA
// support; the tensor index of device-resident files (Tensors) is plain
// Go and is tested on the CPU.
package cudaload

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/stokehq/stoke/engine/cudaexec"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// File is one safetensors file in device memory.
type File struct {
	Name string
	Size int64
	Mem  cudaexec.Memory
}

// Tensors indexes the tensors of safetensors files that sit in device
// memory, reading each file's header back to the host; tensors keep
// pointing into the files' memory.
func Tensors(files []File) (cudaexec.DeviceTensors, error) {
	out := cudaexec.DeviceTensors{}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	for _, f := range files {
		h, err := readHeader(f)
		if err != nil {
			return nil, err
		}
		for _, info := range h.Tensors {
			if _, dup := out[info.Name]; dup {
				return nil, fmt.Errorf("tensor %s is in two weight files (the second is %s)", info.Name, f.Name)
			}
			out[info.Name] = cudaexec.DeviceTensor{DType: info.DType, Shape: info.Shape, Mem: f.Mem, Off: h.DataStart + info.Begin, Source: f.Name}
		}
	}
	return out, nil
}

// readHeader copies a file's length prefix and JSON header to the host
// and parses it.
func readHeader(f File) (*safetensors.Header, error) {
	if f.Size < 8 {
		return nil, fmt.Errorf("read the header of %s: %d bytes is too short for a safetensors file", f.Name, f.Size)
	}
	var prefix [8]byte
	if err := f.Mem.CopyOut(prefix[:], 0); err != nil {
		return nil, fmt.Errorf("read the header of %s from the device: %w", f.Name, err)
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n > safetensors.MaxHeaderSize || int64(n) > f.Size-8 {
		return nil, fmt.Errorf("read the header of %s: a %d-byte header in a %d-byte file: %w", f.Name, n, f.Size, safetensors.ErrInvalidHeader)
	}
	buf := make([]byte, 8+n)
	copy(buf, prefix[:])
	if err := f.Mem.CopyOut(buf[8:], 8); err != nil {
		return nil, fmt.Errorf("read the header of %s from the device: %w", f.Name, err)
	}
	h, err := safetensors.ParseHeader(buf, f.Size)
	if err != nil {
		return nil, fmt.Errorf("read the header of %s: %w", f.Name, err)
	}
	return h, nil
}
