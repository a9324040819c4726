// Package gobin finds the tools `make deps` builds with `go install` (the
// MinIO server, ec2-metadata-mock, Kubernetes, helm) for the tests that
// run them: in $(go env GOPATH)/bin, then ~/go/bin, then on PATH.
package gobin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Find returns the path of the tool name, or an error naming every place
// it looked.
func Find(name string) (string, error) {
	var dirs []string
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, gp := range filepath.SplitList(strings.TrimSpace(string(out))) {
			dirs = append(dirs, filepath.Join(gp, "bin"))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "bin"))
	}
	var tried []string
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
		tried = append(tried, p)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found (tried %s and PATH)", name, strings.Join(tried, ", "))
	}
	return p, nil
}
