package engineapi

import (
	"context"
	"net"
	"net/http"
	"strings"
)

// Dial makes tr reach the engine listening at addr, "unix:///path.sock"
// or "host:port", and returns the host requests to it name ("engine" for
// a unix socket). It is the one place an engine's address is dialled:
// the runtime manager's admin client and the activator's proxy both use it.
func Dial(tr *http.Transport, addr string) (host string) {
	path, ok := strings.CutPrefix(addr, "unix://")
	if !ok {
		return strings.TrimPrefix(addr, "tcp://")
	}
	tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}
	return "engine"
}
