package cudaload

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/stokehq/stoke/engine/cudaexec"
)

// Options choose the GPU a Checkpoint loader serves on.
type Options struct {
	// Device names it: "cuda" (device 0) or "cuda:N".
	Device string
	// Model tunes the GPU forward pass.
	Model cudaexec.Options
}

// ParseDevice returns the ordinal a --device value names: "cuda" is
// device 0, "cuda:N" device N.
func ParseDevice(name string) (int, error) {
	if name == "cuda" {
		return 0, nil
	}
	rest, ok := strings.CutPrefix(name, "cuda:")
	if !ok {
		return 0, fmt.Errorf("device %q: want cpu, cuda or cuda:N", name)
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("device %q: want cuda:N with N a device ordinal", name)
	}
	return n, nil
}
