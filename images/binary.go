package images

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// binaryInfo is what an image needs to know about the binary it wraps.
type binaryInfo struct {
	os, arch, variant string
	// revision is the VCS revision the binary was built from ("" when the
	// build recorded none); modified says the tree had local changes.
	revision string
	modified bool
}

// inspectBinary checks that path is a statically linked Go program for
// Linux, which is all an image with nothing but the binary can run, and
// reads its platform and revision from the Go build information.
func inspectBinary(path string) (binaryInfo, error) {
	f, err := elf.Open(path)
	if err != nil {
		return binaryInfo{}, fmt.Errorf("read ELF header of %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return binaryInfo{}, fmt.Errorf("%s is dynamically linked; an image holding only the binary needs a static one (build with CGO_ENABLED=0)", path)
		}
	}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return binaryInfo{}, fmt.Errorf("read Go build information of %s: %w", path, err)
	}
	var info binaryInfo
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	info.os, info.arch = settings["GOOS"], settings["GOARCH"]
	if info.os != "linux" {
		return binaryInfo{}, fmt.Errorf("%s is built for GOOS=%q; images run linux binaries", path, info.os)
	}
	if info.arch == "" {
		return binaryInfo{}, fmt.Errorf("%s records no GOARCH in its build information", path)
	}
	switch info.arch {
	case "arm":
		if v := settings["GOARM"]; v != "" {
			info.variant = "v" + strings.SplitN(v, ",", 2)[0]
		}
	case "arm64":
		info.variant = "v8"
	}
	info.revision = settings["vcs.revision"]
	info.modified = settings["vcs.modified"] == "true"
	return info, nil
}

// goBuild compiles the stoke command in the module at dir into out as a
// static linux binary for arch.
func goBuild(ctx context.Context, dir, pkg, arch, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		abs, absErr := filepath.Abs(dir)
		if absErr != nil {
			abs = dir
		}
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return fmt.Errorf("go build %s in %s: %w\n%s", pkg, abs, err, strings.TrimSpace(stderr.String()))
		}
		return fmt.Errorf("go build %s in %s: %w", pkg, abs, err)
	}
	return nil
}
