//go:build linux

package container

import (
	"context"
	"strings"
	"testing"

	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
)

func TestNewErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := New(ctx, Options{Socket: "/nonexistent/containerd.sock", Image: "stoke.local/engine:dev", Dir: t.TempDir()}); err == nil {
		t.Fatal("New with containerd down succeeded")
	}
	socket := ctrdtest.StartWithRuntime(t)
	_, err := New(ctx, Options{Socket: socket, Image: "stoke.local/engine:missing", Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "stoke images build --import") {
		t.Fatalf("New with a missing image: %v, want a pointer to stoke images build", err)
	}
	if _, err := New(ctx, Options{Socket: socket}); err == nil {
		t.Fatal("New without a directory and an image succeeded")
	}
}
