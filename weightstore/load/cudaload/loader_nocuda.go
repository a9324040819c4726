//go:build !cuda

package cudaload

import (
	"fmt"

	"github.com/stokehq/stoke/engine/device/cuda"
	"github.com/stokehq/stoke/engine/server"
	"github.com/stokehq/stoke/weightstore/load"
)

// Checkpoint would serve checkpoints on a GPU; this binary was built
// without -tags cuda, so it says so.
func Checkpoint(_ load.Options, co Options) (server.Loader, func() error, error) {
	if _, err := ParseDevice(co.Device); err != nil {
		return nil, nil, err
	}
	return nil, nil, fmt.Errorf("--device %s: %w", co.Device, cuda.ErrNoCUDA)
}
