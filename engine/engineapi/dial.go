package engineapi

import (
	"context"
	"net"
	"net/http"
	"strings"
)

// Dial makes tr reach the engine listening at addr, "unix:///path.sock"
// or "host:port", and returns the host requests to it name ("engine" for
// a unix socket).
func Dial(tr *http.Transport, addr string) (host string) {
	dial, host := Dialer(addr)
	tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }
	return host
}

// Dialer returns what connects to the engine listening at addr,
// "unix:///path.sock" or "host:port", and the host requests to it name
// ("engine" for a unix socket). It is the one place an engine's address
// is dialled: the runtime manager's admin client (through Dial) and the
// activator's proxy both use it.
func Dialer(addr string) (dial func(ctx context.Context) (net.Conn, error), host string) {
	network, address, host := "tcp", strings.TrimPrefix(addr, "tcp://"), ""
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		network, address, host = "unix", path, "engine"
	} else {
		host = address
	}
	return func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, address)
	}, host
}
