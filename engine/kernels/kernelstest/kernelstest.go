// Package kernelstest helps tests above the kernels run on every kernel
// set the CPU supports.
package kernelstest

import (
	"testing"

	"github.com/stokehq/stoke/engine/kernels"
)

// ForEachSet runs test as a subtest, named by the set, on every kernel set
// this CPU runs (kernels.Supported), so that `go test -v` shows a line per
// set.
func ForEachSet(t *testing.T, test func(t *testing.T, set *kernels.Set)) {
	t.Helper()
	for _, set := range kernels.Supported() {
		t.Run(set.Name(), func(t *testing.T) { test(t, set) })
	}
}
