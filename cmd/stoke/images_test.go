package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
)

// tinyStaticBinary compiles a do-nothing static Go program: images only
// need a static linux binary, and this one links in a second.
func tinyStaticBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"go.mod":  "module tiny\n\ngo 1.26\n",
		"main.go": "package main\n\nfunc main() {}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "tiny")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build a tiny static binary: %v\n%s", err, out)
	}
	return bin
}

// imagesCmd runs `stoke images ARGS` and returns its standard output.
func imagesCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := newImagesCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// buildLines checks the lines `images build` prints for each image.
func buildLines(t *testing.T, out, dir, tag string) {
	t.Helper()
	for _, name := range []string{"stoke", "engine"} {
		want := "stoke.local/" + name + ":" + tag
		var found bool
		for _, line := range strings.Split(out, "\n") {
			fields := strings.Fields(line)
			if len(fields) != 3 || fields[0] != want {
				continue
			}
			found = true
			if !strings.HasPrefix(fields[1], "sha256:") || len(fields[1]) != len("sha256:")+64 {
				t.Errorf("%s: digest %q", want, fields[1])
			}
			if fields[2] != filepath.Join(dir, name+".oci.tar") {
				t.Errorf("%s: archive %q, want it in %s", want, fields[2], dir)
			}
			if fi, err := os.Stat(fields[2]); err != nil || fi.Size() == 0 {
				t.Errorf("%s: archive %s: %v", want, fields[2], err)
			}
		}
		if !found {
			t.Errorf("no line for %s in:\n%s", want, out)
		}
	}
}

func TestImagesBuild(t *testing.T) {
	bin := tinyStaticBinary(t)
	dir := t.TempDir()
	out, err := imagesCmd(t, "build", "--binary", bin, "--out", dir, "--tag", "test")
	if err != nil {
		t.Fatalf("images build: %v\n%s", err, out)
	}
	buildLines(t, out, dir, "test")
}

func TestImagesBuildImport(t *testing.T) {
	bin := tinyStaticBinary(t)
	socket := ctrdtest.Start(t)
	dir := t.TempDir()
	out, err := imagesCmd(t, "build", "--binary", bin, "--out", dir, "--import", "--containerd-socket", socket, "--namespace", ctrdtest.Namespace)
	if err != nil {
		t.Fatalf("images build --import: %v\n%s", err, out)
	}
	buildLines(t, out, dir, "dev")
	for _, name := range []string{"stoke", "engine"} {
		want := "imported stoke.local/" + name + ":dev into containerd namespace " + ctrdtest.Namespace + " (snapshotter overlayfs)"
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestImagesBuildRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"socket without import", []string{"build", "--out", dir, "--containerd-socket", "/x.sock"}, "--containerd-socket applies only with --import"},
		{"namespace without import", []string{"build", "--out", dir, "--namespace", "x"}, "--namespace applies only with --import"},
		{"empty namespace", []string{"build", "--out", dir, "--import", "--namespace", ""}, "--import needs"},
		{"dynamic binary", []string{"build", "--out", dir, "--binary", "/bin/sh"}, "dynamically linked"},
		{"stray argument", []string{"build", "extra"}, "unknown command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := imagesCmd(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("images %s: %v, want an error containing %q\n%s", strings.Join(tc.args, " "), err, tc.want, out)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused builds left %d files in %s", len(entries), dir)
	}
}
