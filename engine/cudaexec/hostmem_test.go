package cudaexec

import (
	"fmt"

	"github.com/stokehq/stoke/engine/model"
)

// hostMem is Memory over host bytes, standing in for device memory in
// the CPU tests.
type hostMem struct {
	b    []byte
	addr uint64
}

func (m *hostMem) DeviceAddr() uint64 { return m.addr }

func (m *hostMem) CopyOut(dst []byte, off int64) error {
	if off < 0 || off+int64(len(dst)) > int64(len(m.b)) {
		return fmt.Errorf("copy out %d bytes at %d of %d", len(dst), off, len(m.b))
	}
	copy(dst, m.b[off:])
	return nil
}

// hostTensors puts every tensor of src into one hostMem, back to back at
// offsets aligned to align (an odd align misaligns them), as the loader
// puts a safetensors file on the device.
func hostTensors(src map[string]model.Tensor, align int) DeviceTensors {
	mem := &hostMem{addr: 1 << 40}
	out := DeviceTensors{}
	for name, t := range src {
		for len(mem.b)%align != 0 || (align%2 == 1 && len(mem.b)%2 == 0) {
			mem.b = append(mem.b, 0)
		}
		out[name] = DeviceTensor{DType: t.DType, Shape: t.Shape, Mem: mem, Off: int64(len(mem.b)), Source: "host"}
		mem.b = append(mem.b, t.Data...)
	}
	return out
}
