package activator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Transports keeps one HTTP transport per engine address ("unix:///path"
// or "host:port"), so connections to a replica are reused.
type Transports struct {
	mu sync.Mutex
	m  map[string]*http.Transport
}

// For returns the transport for addr and the URL base requests use.
func (t *Transports) For(addr string) (http.RoundTripper, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*http.Transport{}
	}
	tr, ok := t.m[addr]
	if !ok {
		tr = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, DisableCompression: true, ForceAttemptHTTP2: false}
		if path, unix := strings.CutPrefix(addr, "unix://"); unix {
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", path)
			}
		}
		t.m[addr] = tr
	}
	if strings.HasPrefix(addr, "unix://") {
		return tr, "http://engine"
	}
	return tr, "http://" + addr
}

// Forget closes the idle connections to addr and drops its transport.
func (t *Transports) Forget(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr, ok := t.m[addr]; ok {
		tr.CloseIdleConnections()
		delete(t.m, addr)
	}
}

// errNotStarted marks a forward that failed before the client got a byte:
// the request may go to another replica.
var errNotStarted = errors.New("replica failed before the first byte")

// errClient marks a forward that failed on the client's side (it went
// away): not the replica's fault.
var errClient = errors.New("client failed")

// hopHeaders are not forwarded (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// forward sends a request (its body already read) to the engine at addr
// and streams the answer back, flushing every chunk as it arrives so SSE
// events pass through at once. An error before the first byte reached the
// client wraps errNotStarted; a stream broken later ends with an error
// event when it was SSE.
func (t *Transports) forward(ctx context.Context, addr string, r *http.Request, body []byte, w http.ResponseWriter) error {
	rt, base := t.For(addr)
	req, err := http.NewRequestWithContext(ctx, r.Method, base+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", errNotStarted, err)
	}
	for k, vs := range r.Header {
		req.Header[k] = vs
	}
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	req.ContentLength = int64(len(body))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("%w: %v", errNotStarted, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		// An engine that is shutting down or broken: another may serve.
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%w: status %d: %s", errNotStarted, resp.StatusCode, bytes.TrimSpace(data))
	}
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	for _, hh := range hopHeaders {
		h.Del(hh)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	rc.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return fmt.Errorf("%w: write: %v", errClient, err)
			}
			rc.Flush()
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			if ctx.Err() == nil && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				fmt.Fprintf(w, "data: {\"error\":{\"message\":%q,\"type\":\"server_error\",\"param\":null,\"code\":\"replica_failed\"}}\n\n", "the replica failed mid-stream: "+rerr.Error())
				rc.Flush()
			}
			return fmt.Errorf("read from the replica: %w", rerr)
		}
	}
}
