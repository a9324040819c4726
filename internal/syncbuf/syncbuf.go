// Package syncbuf is a bytes.Buffer safe for concurrent writers, for
// collecting a child process's output while it runs.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer collects writes from several goroutines.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
