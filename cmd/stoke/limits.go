package main

import (
	"net"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/net/netutil"

	"github.com/stokehq/stoke/activator"
)

// limitListener bounds the connections serve holds open: at most total in
// all (netutil.LimitListener: past it, Accept waits until one closes, so
// new connections wait in the kernel's backlog instead of costing a
// goroutine and a descriptor each), and at most perClient from one remote
// IP (past it, a new connection is closed at once). 0 means no limit.
func limitListener(ln net.Listener, total, perClient, sendBuffer int) net.Listener {
	if sendBuffer > 0 {
		ln = sendBufferListener{Listener: ln, size: sendBuffer}
	}
	if perClient > 0 {
		ln = &perClientListener{Listener: ln, max: perClient, open: map[string]int{}}
	}
	if total > 0 {
		ln = netutil.LimitListener(ln, total)
	}
	return ln
}

// sendBufferListener caps the kernel's send buffer of every accepted TCP
// connection. Autotuned, it grows to tcp_wmem's maximum (4 MiB here): that
// is kernel memory a client that stops reading holds per connection, and
// megabytes of a stream the server must write before a stalled write can
// time out.
type sendBufferListener struct {
	net.Listener
	size int
}

func (l sendBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok && err == nil {
		tc.SetWriteBuffer(l.size) // best effort: a refusal leaves the kernel's default
	}
	return c, err
}

// perClientListener counts the open connections of each remote IP.
type perClientListener struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[string]int
}

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		l.mu.Lock()
		if l.open[ip] >= l.max {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.open[ip]++
		l.mu.Unlock()
		return &clientConn{Conn: c, l: l, ip: ip}, nil
	}
}

// remoteIP is a connection's remote address without its port.
func remoteIP(c net.Conn) string {
	addr := c.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// clientConn gives its client's count back once closed.
type clientConn struct {
	net.Conn
	l    *perClientListener
	ip   string
	once sync.Once
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		if c.l.open[c.ip]--; c.l.open[c.ip] <= 0 {
			delete(c.l.open, c.ip)
		}
		c.l.mu.Unlock()
	})
	return err
}

// serveLimits are serve's connection limits (its --read-timeout and
// friends).
type serveLimits struct {
	read, idle, streamWrite     time.Duration
	maxConns, maxConnsPerClient int
	sendBuffer                  string
}

// headerTimeout is how long a client may take to send a request's
// headers: 10s, or the whole read timeout if that is shorter.
func (l *serveLimits) headerTimeout() time.Duration {
	if l.read > 0 && l.read < 10*time.Second {
		return l.read
	}
	return 10 * time.Second
}

func (l *serveLimits) add(fl *pflag.FlagSet) {
	fl.DurationVar(&l.read, "read-timeout", 60*time.Second, "how long a client may take to send a whole request, body included (0 = no limit)")
	fl.DurationVar(&l.idle, "idle-timeout", 120*time.Second, "how long an idle keep-alive connection stays open")
	fl.DurationVar(&l.streamWrite, "stream-write-timeout", activator.DefaultStreamWriteTimeout,
		"how long one write of an answer to a client may stall (a client that stops reading past it has its request, and the engine's, cancelled); a stream may run longer in all")
	fl.IntVar(&l.maxConns, "max-connections", 10000, "client connections open at once; more wait to be accepted (0 = no limit)")
	fl.StringVar(&l.sendBuffer, "client-send-buffer", "256KiB", "kernel send buffer of each client connection (0 = the kernel's autotuning): bounds what a client that stops reading holds, and how soon its stalled stream times out")
	fl.IntVar(&l.maxConnsPerClient, "max-connections-per-client", 0, "client connections open at once from one IP; more are closed at once (0 = no limit)")
}
