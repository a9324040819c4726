// Package spottest finds AWS's EC2 metadata mock (ec2-metadata-mock, which
// `make deps` installs) for tests of spot interruption notices. Without it
// a test is skipped; STOKE_REQUIRE_METADATA_MOCK=1 (which .ci/run sets)
// turns that into a failure.
package spottest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Binary returns the path of ec2-metadata-mock: in $(go env GOPATH)/bin,
// ~/go/bin, else on PATH. Without it the test is skipped (or fails, under
// STOKE_REQUIRE_METADATA_MOCK=1).
func Binary(t testing.TB) string {
	t.Helper()
	var dirs []string
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, gp := range filepath.SplitList(strings.TrimSpace(string(out))) {
			dirs = append(dirs, filepath.Join(gp, "bin"))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "ec2-metadata-mock")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	if p, err := exec.LookPath("ec2-metadata-mock"); err == nil {
		return p
	}
	msg := "ec2-metadata-mock not found (tried " + strings.Join(dirs, ", ") + " and PATH): run `make deps` (scripts/install-ec2-metadata-mock.sh)"
	if os.Getenv("STOKE_REQUIRE_METADATA_MOCK") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
