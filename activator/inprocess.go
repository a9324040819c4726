package activator

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
)

// MaxInProcessAnswer bounds the answer Do keeps.
const MaxInProcessAnswer = 16 << 20

// Do answers one request the platform makes itself (a rollout's eval, say)
// in-process: a POST of body to path (/v1/completions or
// /v1/chat/completions) at priority, returned as the answer's status and
// body. A body naming a revision ("chat@sha256:…") is served by that
// revision alone.
func (a *Activator) Do(ctx context.Context, priority int, path string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("in-process request to %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	ans := &bufferedAnswer{header: http.Header{}}
	if err := a.ServeAt(priority, ans, req); err != nil {
		return 0, nil, fmt.Errorf("in-process request to %s: %w", path, err)
	}
	if ans.over {
		return 0, nil, fmt.Errorf("in-process request to %s: the answer exceeds %d bytes", path, MaxInProcessAnswer)
	}
	return ans.status, ans.body.Bytes(), nil
}

// bufferedAnswer is an http.ResponseWriter that keeps the answer in memory.
type bufferedAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
	over   bool
}

func (b *bufferedAnswer) Header() http.Header { return b.header }

func (b *bufferedAnswer) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}

func (b *bufferedAnswer) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if b.body.Len()+len(p) > MaxInProcessAnswer {
		b.over = true
		return len(p), nil
	}
	return b.body.Write(p)
}

// Flush implements http.Flusher (a stream's chunks are kept whole).
func (b *bufferedAnswer) Flush() {}
