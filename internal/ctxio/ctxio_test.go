package ctxio

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReaderStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := Reader(ctx, strings.NewReader("hello world"))
	buf := make([]byte, 5)
	if n, err := r.Read(buf); n != 5 || err != nil || string(buf) != "hello" {
		t.Fatalf("read %d %q %v", n, buf[:n], err)
	}
	cancel()
	if _, err := io.ReadAll(r); !errors.Is(err, context.Canceled) {
		t.Fatalf("read after cancel: %v", err)
	}
}
