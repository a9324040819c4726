package activator

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// engineTransport is the HTTP/1.1 client of one engine. It is not
// http.Transport because of what that costs a request on the gateway's
// two cores: every pooled connection there has a read loop and a write
// loop goroutine, so each exchange is two goroutine hand-offs (and the
// futex wake-ups they take) on top of the syscalls. Here the goroutine
// that forwards the request writes it and reads the answer itself, over a
// pooled connection; the request and response are still written and
// parsed by net/http (Request.Write, ReadResponse), and
// httputil.ReverseProxy still drives it as its RoundTripper.
//
// A connection goes back to the pool when its answer was read to the end
// and neither side asked to close it; one whose answer was cut off, or
// whose request's context ended, is closed (the engine sees the client
// gone and stops generating). Idle connections are not watched, so one
// the engine closed is found only by the next request on it: an exchange
// on a pooled connection that fails before any answer arrives is tried
// once more on a new one when the request's body can be read again.
type engineTransport struct {
	dial    func(ctx context.Context) (net.Conn, error)
	maxIdle int
	idleFor time.Duration // an idle connection older than this is closed

	mu     sync.Mutex
	idle   []*engineConn // most recently used last
	closed bool          // forgotten: connections are no longer pooled
}

// engineConn is a connection to the engine with its buffers.
type engineConn struct {
	net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time // when it went idle
}

// aLongTimeAgo is a deadline in the past, which interrupts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// RoundTrip sends req to the engine and returns its answer, whose body
// must be read to the end or closed.
func (t *engineTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	for try := 0; ; try++ {
		c, pooled, err := t.conn(ctx)
		if err != nil {
			closeBody(req)
			return nil, fmt.Errorf("dial the engine: %w", err)
		}
		resp, err := t.exchange(ctx, c, req)
		if err == nil {
			return resp, nil
		}
		c.Close()
		var headless *noAnswerError
		if !pooled || try > 0 || ctx.Err() != nil || !errors.As(err, &headless) || !rewind(req) {
			closeBody(req)
			return nil, err
		}
	}
}

// noAnswerError is an exchange that got no byte of an answer: on a pooled
// connection, most likely one the engine had closed while it was idle.
type noAnswerError struct{ err error }

func (e *noAnswerError) Error() string { return e.err.Error() }
func (e *noAnswerError) Unwrap() error { return e.err }

// rewind makes req's body readable from its start again, for a retry.
func rewind(req *http.Request) bool {
	if req.Body == nil || req.Body == http.NoBody {
		return true
	}
	if req.GetBody == nil {
		return false
	}
	body, err := req.GetBody()
	if err != nil {
		return false
	}
	req.Body = body
	return true
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// exchange writes req on c and reads the answer's head. Until the answer's
// body is done, the end of ctx interrupts any read or write on c.
func (t *engineTransport) exchange(ctx context.Context, c *engineConn, req *http.Request) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(aLongTimeAgo) })
	fail := func(op string, err error) (*http.Response, error) {
		stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	// Request.Write closes the body it sends; RoundTrip closes it once,
	// when it is done with the request.
	body := req.Body
	if body != nil {
		req.Body = readOnly{body}
	}
	err := req.Write(unflushed{c.bw})
	req.Body = body
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		return fail("write the request", &noAnswerError{err})
	}
	if _, err := c.br.Peek(1); err != nil {
		return fail("read the answer", &noAnswerError{err})
	}
	resp, err := http.ReadResponse(c.br, req)
	for err == nil && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(c.br, req) // skip 1xx informational answers
	}
	if err != nil {
		return fail("read the answer", err)
	}
	resp.Body = &engineBody{body: resp.Body, ctx: ctx, c: c, t: t, stop: stop, reuse: !resp.Close && !req.Close}
	return resp, nil
}

// unflushed is a connection's buffered writer as Request.Write sees it.
// Handed a *bufio.Writer, Request.Write flushes the head on its own
// before a body it does not know to be in memory, so head and body would
// be two writes to the engine (two syscalls, and two wake-ups of its
// reader); through this it buffers both, and exchange flushes once.
type unflushed struct{ *bufio.Writer }

// readOnly is a request body without its Close.
type readOnly struct{ io.Reader }

func (readOnly) Close() error { return nil }

// conn returns a pooled connection (pooled true) or a new one.
func (t *engineTransport) conn(ctx context.Context) (c *engineConn, pooled bool, err error) {
	now := time.Now()
	t.mu.Lock()
	for len(t.idle) > 0 {
		c = t.idle[len(t.idle)-1]
		t.idle = t.idle[:len(t.idle)-1]
		if now.Sub(c.used) < t.idleFor {
			t.mu.Unlock()
			return c, true, nil
		}
		c.Close()
	}
	t.mu.Unlock()
	nc, err := t.dial(ctx)
	if err != nil {
		return nil, false, err
	}
	return &engineConn{Conn: nc, br: bufio.NewReaderSize(nc, 16<<10), bw: bufio.NewWriterSize(nc, 16<<10)}, false, nil
}

// put pools c for the next request, or closes it when the pool is full
// or the transport forgotten.
func (t *engineTransport) put(c *engineConn) {
	c.used = time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || len(t.idle) >= t.maxIdle {
		c.Close()
		return
	}
	t.idle = append(t.idle, c)
}

// CloseIdleConnections closes the pooled connections.
func (t *engineTransport) CloseIdleConnections() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.idle {
		c.Close()
	}
	t.idle = nil
}

// close closes the pooled connections and pools no more: the engine is
// gone, and answers still being read close their connections at the end.
func (t *engineTransport) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.CloseIdleConnections()
}

// engineBody is an answer's body; at its end its connection is pooled
// again or closed.
type engineBody struct {
	body  io.ReadCloser
	ctx   context.Context
	c     *engineConn
	t     *engineTransport
	stop  func() bool // stops the context's interruption; false once it ran
	reuse bool        // neither side asked to close the connection
	done  bool
}

func (b *engineBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	switch {
	case err == io.EOF:
		b.finish(true)
	case err != nil:
		b.finish(false)
		if b.ctx.Err() != nil {
			err = b.ctx.Err()
		}
	}
	return n, err
}

// Close ends the body; one not read to its end leaves its connection
// unusable, so it is closed.
func (b *engineBody) Close() error {
	if !b.done {
		b.finish(false)
	}
	return nil
}

func (b *engineBody) finish(whole bool) {
	b.done = true
	if b.stop() && whole && b.reuse {
		b.t.put(b.c)
		return
	}
	b.c.Close()
}
