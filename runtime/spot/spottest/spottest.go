// Package spottest finds AWS's EC2 metadata mock (ec2-metadata-mock, which
// `make deps` installs) for tests of spot interruption notices. Without it
// a test is skipped; STOKE_REQUIRE_METADATA_MOCK=1 (which .ci/run sets)
// turns that into a failure.
package spottest

import (
	"os"
	"testing"

	"github.com/stokehq/stoke/internal/gobin"
)

// Binary returns the path of ec2-metadata-mock: in $(go env GOPATH)/bin,
// ~/go/bin, else on PATH. Without it the test is skipped (or fails, under
// STOKE_REQUIRE_METADATA_MOCK=1).
func Binary(t testing.TB) string {
	t.Helper()
	p, err := gobin.Find("ec2-metadata-mock")
	if err == nil {
		return p
	}
	msg := err.Error() + ": run `make deps` (scripts/install-ec2-metadata-mock.sh)"
	if os.Getenv("STOKE_REQUIRE_METADATA_MOCK") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
