// Package ctxio makes plain readers honour a context, so long copies of
// weights stop when their request is cancelled.
package ctxio

import (
	"context"
	"io"
)

// Reader returns r with every Read failing once ctx is done.
func Reader(ctx context.Context, r io.Reader) io.Reader { return reader{ctx, r} }

type reader struct {
	ctx context.Context
	r   io.Reader
}

func (c reader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
