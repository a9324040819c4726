package activator

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
)

// transportTo returns an engineTransport to srv and counts the
// connections srv accepts.
func transportTo(t *testing.T, srv *httptest.Server) (*engineTransport, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	dial, _ := engineapi.Dialer(srv.Listener.Addr().String())
	return &engineTransport{dial: dial, maxIdle: 4, idleFor: time.Minute}, &conns
}

// roundTrip sends body to url through tr and returns the answer's body and
// trailer.
func roundTrip(t *testing.T, ctx context.Context, tr http.RoundTripper, url, body string) (string, http.Header, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.Trailer, err
}

func TestEngineTransport(t *testing.T) {
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Trailer", engineapi.UsageTrailer)
		w.Write(bytes.ToUpper(b))
		w.(http.Flusher).Flush()
		w.Header().Set(engineapi.UsageTrailer, `{"total_tokens":3}`)
	})

	t.Run("answers reuse one connection and keep their trailers", func(t *testing.T) {
		tr, conns := transportTo(t, httptest.NewUnstartedServer(echo))
		for i := range 5 {
			got, trailer, err := roundTrip(t, context.Background(), tr, "http://engine/x", "hello")
			if err != nil || got != "HELLO" || trailer.Get(engineapi.UsageTrailer) != `{"total_tokens":3}` {
				t.Fatalf("request %d: %q, trailer %v, %v", i, got, trailer, err)
			}
		}
		if n := conns.Load(); n != 1 {
			t.Errorf("5 sequential requests opened %d connections, want 1", n)
		}
	})

	t.Run("a connection the engine closed while idle is replaced", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(echo)
		tr, conns := transportTo(t, srv)
		if _, _, err := roundTrip(t, context.Background(), tr, "http://engine/x", "one"); err != nil {
			t.Fatal(err)
		}
		srv.CloseClientConnections()
		got, _, err := roundTrip(t, context.Background(), tr, "http://engine/x", "two")
		if err != nil || got != "TWO" {
			t.Fatalf("after the engine closed the idle connection: %q, %v", got, err)
		}
		if n := conns.Load(); n != 2 {
			t.Errorf("opened %d connections, want 2", n)
		}
	})

	t.Run("an answer cut off is not pooled", func(t *testing.T) {
		tr, conns := transportTo(t, httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write(bytes.Repeat([]byte("x"), 1<<20))
		})))
		for range 2 {
			req, _ := http.NewRequest(http.MethodGet, "http://engine/x", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.ReadFull(resp.Body, make([]byte, 10))
			resp.Body.Close()
		}
		if n := conns.Load(); n != 2 {
			t.Errorf("two answers closed half-read opened %d connections, want 2", n)
		}
	})

	t.Run("the end of the context interrupts a waiting request", func(t *testing.T) {
		release := make(chan struct{})
		var gone atomic.Bool
		tr, _ := transportTo(t, httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.ReadAll(r.Body) // as an engine does; the server watches the connection from then on
			select {
			case <-r.Context().Done():
				gone.Store(true)
			case <-release:
			}
		})))
		defer close(release)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, _, err := roundTrip(t, ctx, tr, "http://engine/x", "wait")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want the context's deadline", err)
		}
		for deadline := time.Now().Add(5 * time.Second); !gone.Load(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the engine never saw the client go")
			}
		}
	})

	t.Run("an engine that is gone is an error", func(t *testing.T) {
		dial, _ := engineapi.Dialer("unix://" + t.TempDir() + "/none.sock")
		tr := &engineTransport{dial: dial, maxIdle: 4, idleFor: time.Minute}
		if _, _, err := roundTrip(t, context.Background(), tr, "http://engine/x", "x"); err == nil || !strings.Contains(err.Error(), "dial the engine") {
			t.Fatalf("got %v, want a dial error", err)
		}
	})
}

// writeCounter is a connection that counts its writes.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestEngineTransportSendsARequestInOneWrite checks that a request's head
// and a body Request.Write cannot tell is in memory (as ReverseProxy hands
// it over) reach the engine in one write: one syscall, one wake-up of the
// engine's reader.
func TestEngineTransportSendsARequestInOneWrite(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	tr, _ := transportTo(t, srv)
	var writes atomic.Int64
	dial := tr.dial
	tr.dial = func(ctx context.Context) (net.Conn, error) {
		c, err := dial(ctx)
		return writeCounter{c, &writes}, err
	}
	const body = `{"model":"chat","prompt":"hello there","max_tokens":1}`
	for i := range 3 {
		req, err := http.NewRequest(http.MethodPost, "http://engine/v1/completions", struct{ io.Reader }{strings.NewReader(body)})
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(body))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != body {
			t.Fatalf("answer %q, %v; want the body echoed", got, err)
		}
		if n := writes.Load(); n != int64(i+1) {
			t.Fatalf("after %d requests the engine's connection took %d writes, want %d", i+1, n, i+1)
		}
	}
}
