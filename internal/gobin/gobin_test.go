package gobin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFind finds a tool in GOPATH/bin before PATH, falls back to PATH,
// and names where it looked when the tool is nowhere.
func TestFind(t *testing.T) {
	gopath, onPath := t.TempDir(), t.TempDir()
	for _, p := range []string{filepath.Join(gopath, "bin", "tool"), filepath.Join(onPath, "tool"), filepath.Join(onPath, "other")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("GOPATH", gopath)
	t.Setenv("PATH", onPath+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, tc := range []struct{ name, want, wantErr string }{
		{"tool", filepath.Join(gopath, "bin", "tool"), ""},
		{"other", filepath.Join(onPath, "other"), ""},
		{"stoke-no-such-tool", "", filepath.Join(gopath, "bin", "stoke-no-such-tool")},
	} {
		got, err := Find(tc.name)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Find(%q) = %q, %v; want an error naming %s", tc.name, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Find(%q) = %q, %v; want %s", tc.name, got, err, tc.want)
		}
	}
}
