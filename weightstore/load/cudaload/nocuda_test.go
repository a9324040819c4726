//go:build !cuda

package cudaload

import (
	"errors"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/device/cuda"
	"github.com/stokehq/stoke/weightstore/load"
)

// TestCheckpointWithoutCUDA checks a CPU-only binary refuses --device
// cuda with one clear line.
func TestCheckpointWithoutCUDA(t *testing.T) {
	_, _, err := Checkpoint(load.Options{}, Options{Device: "cuda"})
	if !errors.Is(err, cuda.ErrNoCUDA) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %q, want ErrNoCUDA on one line", err)
	}
	if _, _, err := Checkpoint(load.Options{}, Options{Device: "tpu"}); err == nil || errors.Is(err, cuda.ErrNoCUDA) {
		t.Fatalf("an unknown device: %v", err)
	}
}
