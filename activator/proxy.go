package activator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/openai"
)

// Transports keeps, per engine address ("unix:///path" or "host:port"),
// one HTTP client (an engineTransport), so connections to a replica are
// reused, and the reverse proxy that forwards requests over it.
type Transports struct {
	// WriteTimeout, when positive, bounds each write and flush to the
	// client (each has at least 3/4 of it): one that stalls (a client that
	// stopped reading) fails the forward, which cancels the engine's
	// request. Set before the first forward.
	WriteTimeout time.Duration

	mu sync.Mutex
	m  map[string]*engineProxy
}

// engineProxy is the reverse proxy to one engine.
type engineProxy struct {
	tr   *engineTransport
	host string // the URL host of requests to the engine
	rp   httputil.ReverseProxy
}

// For returns the transport for addr and the URL base requests use.
func (t *Transports) For(addr string) (http.RoundTripper, string) {
	p := t.proxy(addr)
	return p.tr, "http://" + p.host
}

// proxy returns addr's proxy, making it on first use.
func (t *Transports) proxy(addr string) *engineProxy {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.m[addr]; ok {
		return p
	}
	if t.m == nil {
		t.m = map[string]*engineProxy{}
	}
	dial, host := engineapi.Dialer(addr)
	p := &engineProxy{tr: &engineTransport{dial: dial, maxIdle: 256, idleFor: 90 * time.Second}, host: host}
	p.rp = httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.tr,
		ModifyResponse: modifyResponse,
		ErrorHandler:   proxyError,
		BufferPool:     copyBuffers,
		// FlushInterval stays 0: ReverseProxy flushes every write of a
		// text/event-stream answer (and of one of unknown length) at once
		// whatever it says, as SSE needs (-1), while a plain answer of
		// known length goes out in one write at its end.
	}
	t.m[addr] = p
	return p
}

// Forget closes the idle connections to addr and drops its transport.
func (t *Transports) Forget(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.m[addr]; ok {
		p.tr.close()
		delete(t.m, addr)
	}
}

// errNotStarted marks a forward that failed before the client got a byte:
// the request may go to another replica.
var errNotStarted = errors.New("replica failed before the first byte")

// errTooLong marks a forward the engine refused before the first byte as
// longer than its model's context (asked for only when a route has a
// next target, which may have a longer one).
var errTooLong = errors.New("request longer than the model's context")

// errClient marks a forward that failed on the client's side (it went
// away, or sent what cannot be proxied): not the replica's fault.
var errClient = errors.New("client failed")

// forward sends a request (its body already read) through rp, an
// engine's proxy (Transports.proxy) or a provider's, whose ModifyResponse
// and ErrorHandler are modifyResponse and proxyError, and streams the
// answer back; SSE events
// pass through as they arrive. It returns nil once the whole answer went
// out; an error wrapping errNotStarted when the engine could not be
// reached or answered 5xx, with nothing written to w (the caller may try
// another replica); one wrapping errClient when writing to the client
// failed; any other error when the engine failed mid-answer, after which a
// stream has ended with an error event. Cancelling ctx (the client went
// away) cancels the engine's request. used is the usage the engine sent
// in its UsageTrailer (a stream's; nil when it sent none), which the
// client does not get.
//
// ReverseProxy aborts the handler with panic(http.ErrAbortHandler) when
// copying the body fails, which would skip the caller's accounting and
// lose the reason; so the attempt hands ReverseProxy a body that turns a
// read error into the end of the answer (after the stream's error event)
// and a writer that records a client write error and makes the body end,
// and forward reports what they recorded.
//
// With tooLongFallsBack, an answer that the request is longer than the
// model's context is not passed on but returned as an error wrapping
// errTooLong.
func (t *Transports) forward(ctx context.Context, rp *httputil.ReverseProxy, r *http.Request, body []byte, w http.ResponseWriter, tooLongFallsBack bool) (used *openai.Usage, err error) {
	a := &attempt{w: w, ctx: ctx, rc: http.NewResponseController(w), writeTimeout: t.WriteTimeout, tooLongFallsBack: tooLongFallsBack}
	a.req.Reset(body)
	in := r.WithContext(context.WithValue(ctx, attemptKey{}, a))
	in.Body, in.ContentLength = &a.req, int64(len(body))
	in.GetBody = func() (io.ReadCloser, error) {
		a.req.Reset(body)
		return &a.req, nil
	}
	rp.ServeHTTP(a, in)
	return a.used, a.err
}

// attemptKey is the context key of a request's attempt, for
// ModifyResponse, which sees only the engine's response.
type attemptKey struct{}

// attempt is one forward of a request to one engine: the ResponseWriter
// ReverseProxy writes to (it passes the writes on to the client's) and the
// engine's response body ReverseProxy reads.
type attempt struct {
	w  http.ResponseWriter // the client's
	rc *http.ResponseController
	// writeTimeout bounds each write and flush to the client (0: none).
	writeTimeout time.Duration
	deadlineSet  time.Time // when the client's write deadline last moved
	ctx          context.Context
	// tooLongFallsBack turns the engine's context_length_exceeded into
	// errTooLong instead of the answer.
	tooLongFallsBack bool
	req              requestBody
	resp             io.ReadCloser // the engine's answer
	trailer          http.Header   // its trailers, filled at the body's end
	used             *openai.Usage // from its UsageTrailer
	sse              bool
	rewritten        bool   // ReverseProxy got as far as Rewrite
	ended            bool   // the body reads EOF from now on
	gone             bool   // writing to the client failed
	pending          []byte // the error event still to read
	err              error  // the first failure
}

// requestBody is the request's body, read again for each attempt.
type requestBody struct{ bytes.Reader }

func (*requestBody) Close() error { return nil }

func (a *attempt) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// Header, WriteHeader and Write pass ReverseProxy's output to the client;
// a failed write is recorded and ends the engine's body, never reported
// to ReverseProxy.
func (a *attempt) Header() http.Header { return a.w.Header() }

func (a *attempt) WriteHeader(code int) { a.w.WriteHeader(code) }

func (a *attempt) Write(p []byte) (int, error) {
	if a.gone {
		return len(p), nil
	}
	a.deadline()
	if _, err := a.w.Write(p); err != nil {
		a.clientFailed("write", err)
	}
	return len(p), nil
}

// FlushError flushes the client's writer (ReverseProxy flushes through it
// after every write of a stream) under the write deadline; a failure is
// recorded like a failed write.
func (a *attempt) FlushError() error {
	if a.gone {
		return nil
	}
	a.deadline()
	if err := a.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		a.clientFailed("flush", err)
	}
	return nil
}

// deadline gives the next write to the client at least three quarters of
// writeTimeout to complete. Moving the deadline resets a runtime timer,
// which a stream would otherwise pay twice a token (write and flush); so
// it moves only once a quarter of writeTimeout has passed since it last
// did. (The server clears the deadline once the response is done.)
func (a *attempt) deadline() {
	if a.writeTimeout <= 0 {
		return
	}
	now := time.Now()
	if now.Sub(a.deadlineSet) < a.writeTimeout/4 { // never set: a long time ago
		return
	}
	a.deadlineSet = now
	a.rc.SetWriteDeadline(now.Add(a.writeTimeout))
}

// clientFailed records that the client could not be written to (it went
// away, or stopped reading past the write deadline) and ends the engine's
// body, which cancels the engine's request.
func (a *attempt) clientFailed(op string, err error) {
	a.fail(fmt.Errorf("%w: %s: %v", errClient, op, err))
	a.gone, a.ended, a.pending = true, true, nil
}

// Unwrap lets http.ResponseController reach the client's writer.
func (a *attempt) Unwrap() http.ResponseWriter { return a.w }

// Read and Close are the engine's body as ReverseProxy sees it.
func (a *attempt) Read(p []byte) (int, error) {
	if len(a.pending) > 0 {
		n := copy(p, a.pending)
		a.pending = a.pending[n:]
		return n, nil
	}
	if a.ended {
		return 0, io.EOF
	}
	n, err := a.resp.Read(p)
	switch {
	case err == nil:
		return n, nil
	case err == io.EOF:
		a.ended = true
		a.takeUsage()
		return n, io.EOF
	}
	// The replica failed mid-answer (or the client went away and took the
	// request's context along).
	a.ended = true
	a.fail(fmt.Errorf("read from the replica: %w", err))
	if a.sse && a.ctx.Err() == nil {
		a.pending = midStreamError(err)
	}
	return n, nil
}

func (a *attempt) Close() error { return a.resp.Close() }

// takeUsage reads the engine's UsageTrailer, once the body has ended, and
// removes it so ReverseProxy does not pass it on.
func (a *attempt) takeUsage() {
	v := a.trailer.Get(engineapi.UsageTrailer)
	if v == "" {
		return
	}
	a.trailer.Del(engineapi.UsageTrailer)
	var u openai.Usage
	if json.Unmarshal([]byte(v), &u) == nil {
		a.used = &u
	}
}

// midStreamError is the SSE event that ends a stream whose replica failed.
func midStreamError(err error) []byte {
	e := &openai.Error{Status: http.StatusBadGateway, Type: openai.TypeServer, Code: "replica_failed",
		Message: "the replica failed mid-stream: " + err.Error()}
	data, _ := json.Marshal(e.Body())
	return append(append([]byte("data: "), data...), "\n\n"...)
}

// rewrite points the outgoing request at the engine. The client's headers
// go along (ReverseProxy drops the hop-by-hop ones and the client's
// X-Forwarded-*); a protocol upgrade does not.
func (p *engineProxy) rewrite(pr *httputil.ProxyRequest) {
	if a, ok := pr.In.Context().Value(attemptKey{}).(*attempt); ok {
		a.rewritten = true
	}
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = p.host
	pr.Out.Host = ""
	if _, ok := pr.Out.Header["Upgrade"]; ok {
		pr.Out.Header.Del("Upgrade")
		pr.Out.Header.Del("Connection")
	}
}

// modifyResponse turns an engine's 5xx (shutting down, broken: another may
// serve) into an error before anything reaches the client, and wraps the
// body of any other answer.
func modifyResponse(res *http.Response) error {
	a := res.Request.Context().Value(attemptKey{}).(*attempt)
	if res.StatusCode >= 500 {
		data, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		return fmt.Errorf("%w: status %d: %s", errNotStarted, res.StatusCode, bytes.TrimSpace(data))
	}
	if a.tooLongFallsBack && res.StatusCode == http.StatusBadRequest {
		data, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error.Code == openai.CodeContextLength {
			return fmt.Errorf("%w: %s", errTooLong, bytes.TrimSpace(data))
		}
		res.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(data), res.Body), res.Body}
	}
	a.sse = isEventStream(res.Header.Get("Content-Type"))
	a.resp, res.Body = res.Body, a
	// The usage trailer is the activator's, not the client's: unannounced,
	// and taken out when it comes (takeUsage).
	res.Trailer.Del(engineapi.UsageTrailer)
	if res.Trailer == nil {
		res.Trailer = http.Header{}
	}
	a.trailer = res.Trailer
	return nil
}

// proxyError records why ReverseProxy could not forward: the engine could
// not be reached or answered 5xx (retryable elsewhere), or the request
// could not even be prepared (the client's doing, answered 400 here).
// It writes nothing in the first case: the caller decides.
func proxyError(w http.ResponseWriter, _ *http.Request, err error) {
	a := w.(*attempt)
	switch {
	case errors.Is(err, errNotStarted), errors.Is(err, errTooLong):
		a.fail(err)
	case !a.rewritten:
		a.fail(fmt.Errorf("%w: %v", errClient, err))
		writeError(a.w, openai.InvalidRequest("", "the request cannot be proxied: %v", err), 0)
	default:
		a.fail(fmt.Errorf("%w: %v", errNotStarted, err))
	}
}

// copyBufferSize is the size of ReverseProxy's copy buffers.
const copyBufferSize = 32 << 10

// bufferPool lends ReverseProxy its copy buffers instead of one new 32 KiB
// buffer per request.
type bufferPool struct{ p sync.Pool }

var copyBuffers = &bufferPool{}

func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return buf[:]
	}
	return make([]byte, copyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if len(buf) == copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(buf))
	}
}
