package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// openFDs counts the open descriptors of process pid.
func openFDs(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// raiseNoFile lifts this process's descriptor limit to its hard limit and
// skips the test when that is below need.
func raiseNoFile(t *testing.T, need uint64) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	if lim.Max < need {
		t.Skipf("RLIMIT_NOFILE hard limit %d < %d", lim.Max, need)
	}
}

// TestServeSlowBodies holds 5,000 connections whose bodies stop after one
// byte against serve: its descriptors stay bounded by --max-connections,
// /health keeps answering, and the read timeout closes every one.
func TestServeSlowBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 5,000 connections")
	}
	const conns, maxConns = 5000, 1000
	raiseNoFile(t, conns+1000)
	s := launchServe(t, nil, freeAddr(t), "--data", t.TempDir(), "--warm", "0",
		"--read-timeout", "2s", "--max-connections", fmt.Sprint(maxConns))
	s.waitHealthy(t)
	pid := s.cmd.Process.Pid
	addr := strings.TrimPrefix(s.base, "http://")

	var closed, dialFailed atomic.Int32
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", addr, 60*time.Second)
			if err != nil {
				dialFailed.Add(1)
				return
			}
			defer c.Close()
			io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
			c.SetReadDeadline(time.Now().Add(90 * time.Second))
			_, err = io.Copy(io.Discard, c) // until serve closes it
			if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
				closed.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	maxFDs, healthOK := 0, 0
	hc := &http.Client{Timeout: 30 * time.Second}
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-time.After(200 * time.Millisecond):
		}
		maxFDs = max(maxFDs, openFDs(pid))
		resp, err := hc.Get(s.base + "/health")
		if err != nil {
			t.Fatalf("/health stopped answering under %d slow bodies: %v", conns, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/health: %d", resp.StatusCode)
		}
		healthOK++
	}
	t.Logf("serve's descriptors peaked at %d (limit %d connections); /health answered %d times; %d of %d closed by serve, %d dials failed",
		maxFDs, maxConns, healthOK, closed.Load(), conns, dialFailed.Load())
	if maxFDs > maxConns+200 {
		t.Errorf("serve held %d descriptors, past --max-connections %d", maxFDs, maxConns)
	}
	if closed.Load() != conns {
		t.Errorf("serve closed %d of %d slow connections (dials failed: %d)", closed.Load(), conns, dialFailed.Load())
	}
}

// TestServeStalledStreams: 50 streaming clients that never read (tiny
// receive buffers) release their replica within the stream write
// deadline: stoke_activator_in_flight returns to 0 and the replica serves
// the next request. The small findings ride along: a 7 MB prompt is
// refused before tokenizing, long echoed values come back cut.
func TestServeStalledStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("runs serve with sim engines")
	}
	bucketDir := pushServed(t, "chat", "replicas:\n  min: 1\n  max: 1\n")
	base := startServe(t, nil, "--data", t.TempDir(), "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
		"--warm", "0", "--slots", "2", "--sim-profile", "llama-3.1-8b-fp8-h100", "--stream-write-timeout", "1s", "--client-send-buffer", "8KiB")
	waitUntil(t, "a ready replica", 60*time.Second, func() bool { return readyReplicas(t, base, "chat") == 1 })
	addr := strings.TrimPrefix(base, "http://")

	body := `{"model":"chat","prompt":"hello","max_tokens":100000,"ignore_eos":true,"stream":true}`
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
	}}
	for range 50 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	inFlight := func() float64 { return metricValue(t, base, `stoke_activator_in_flight{model="chat"}`) }
	waitUntil(t, "the streams are in flight", 30*time.Second, func() bool { return inFlight() > 0 })
	waitUntil(t, "the stalled streams release the replica", 120*time.Second, func() bool { return inFlight() == 0 })

	post := func(body string, header http.Header) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	if resp, b := post(`{"model":"chat","prompt":"hi","max_tokens":2}`, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("request after the stalled streams: %d %s", resp.StatusCode, b)
	}

	for _, tc := range []struct {
		name   string
		body   string
		header http.Header
		check  func(*http.Response, string) error
	}{
		{"prompt capped before tokenizing", `{"model":"chat","prompt":"` + strings.Repeat("a ", 7<<19) + `","max_tokens":1}`, nil,
			func(r *http.Response, b string) error {
				if r.StatusCode != http.StatusBadRequest || !strings.Contains(b, `"param":"prompt"`) {
					return fmt.Errorf("%d %.300s, want 400 naming prompt", r.StatusCode, b)
				}
				return nil
			}},
		{"model name cut", `{"model":"` + strings.Repeat("m", 1<<20) + `","prompt":"hi"}`, nil,
			func(r *http.Response, b string) error {
				if r.StatusCode != http.StatusNotFound || len(b) > 2048 {
					return fmt.Errorf("%d with a %d-byte body, want a short 404", r.StatusCode, len(b))
				}
				return nil
			}},
		{"request id cut", `{"model":"chat","prompt":"hi","max_tokens":1}`, http.Header{"X-Request-Id": {strings.Repeat("r", 900<<10)}},
			func(r *http.Response, b string) error {
				if n := len(r.Header.Get("X-Request-Id")); r.StatusCode != http.StatusOK || n == 0 || n > 256 {
					return fmt.Errorf("%d, X-Request-Id of %d bytes echoed, want at most 256", r.StatusCode, n)
				}
				return nil
			}},
	} {
		resp, b := post(tc.body, tc.header)
		if err := tc.check(resp, b); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestLimitListenerPerClient: past --max-connections-per-client a new
// connection from the same IP is closed at once; closing one makes room.
func TestLimitListenerPerClient(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := limitListener(inner, 0, 2, 0)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() // echo until the client closes
		}
	}()
	echo := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "x\n"); err != nil {
			return err
		}
		_, err := bufio.NewReader(c).ReadString('\n')
		return err
	}
	var cs []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs = append(cs, c)
	}
	if echo(cs[0]) != nil || echo(cs[1]) != nil {
		t.Fatal("the first two connections were refused")
	}
	if echo(cs[2]) == nil {
		t.Fatal("a third connection from one client was served past the limit of 2")
	}
	cs[0].Close()
	time.Sleep(100 * time.Millisecond) // the echo goroutine sees the close
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c); err != nil {
		t.Fatalf("no room after a connection closed: %v", err)
	}
}
