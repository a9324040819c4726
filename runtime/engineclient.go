package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
)

// EngineClient speaks an engine runtime's admin API over its socket.
type EngineClient struct {
	addr string // the host requests name (engineapi.Dial)
	http *http.Client
}

// NewEngineClient returns a client for the engine listening at addr:
// "unix:///path.sock" or "host:port".
func NewEngineClient(addr string) *EngineClient {
	tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}
	return &EngineClient{addr: engineapi.Dial(tr, addr), http: &http.Client{Transport: tr}}
}

// errNotLaunched is a dial to a runtime whose address is not known yet.
var errNotLaunched = errors.New("the runtime has no address yet")

// clientOf returns a client for p's engine that asks p for its address
// at every new connection: a backend may learn it only once the runtime
// runs (a pod's IP once it is scheduled), after Start returned.
func clientOf(p Process) *EngineClient {
	tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		addr := p.Addr()
		if addr == "" {
			return nil, fmt.Errorf("runtime %s: %w", p.ID(), errNotLaunched)
		}
		network, address := "tcp", strings.TrimPrefix(addr, "tcp://")
		if path, ok := strings.CutPrefix(addr, "unix://"); ok {
			network, address = "unix", path
		}
		return (&net.Dialer{}).DialContext(ctx, network, address)
	}
	return &EngineClient{addr: "engine", http: &http.Client{Transport: tr}}
}

// State returns GET /admin/state.
func (c *EngineClient) State(ctx context.Context) (engineapi.StateInfo, error) {
	var st engineapi.StateInfo
	err := c.do(ctx, http.MethodGet, "/admin/state", nil, &st)
	return st, err
}

// Load posts /admin/load and returns the state after it.
func (c *EngineClient) Load(ctx context.Context, req engineapi.LoadRequest) (engineapi.StateInfo, error) {
	var st engineapi.StateInfo
	err := c.do(ctx, http.MethodPost, "/admin/load", req, &st)
	return st, err
}

// Sleep, Wake and Unload post the admin operation of the same name.
func (c *EngineClient) Sleep(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/admin/sleep", nil, nil)
}

// Wake posts /admin/wake.
func (c *EngineClient) Wake(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/admin/wake", nil, nil)
}

// Unload posts /admin/unload.
func (c *EngineClient) Unload(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/admin/unload", nil, nil)
}

// Complete sends a one-token completion of prompt ids, to warm a replica.
func (c *EngineClient) Complete(ctx context.Context, model string, prompt []int32) error {
	body := map[string]any{"model": model, "prompt": prompt, "max_tokens": 1}
	return c.do(ctx, http.MethodPost, "/v1/completions", body, nil)
}

// Close drops idle connections.
func (c *EngineClient) Close() { c.http.CloseIdleConnections() }

func (c *EngineClient) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			return fmt.Errorf("%s %s: %d: %s", method, path, resp.StatusCode, e.Error.Message)
		}
		return fmt.Errorf("%s %s: %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode %s: %w", method, path, data, err)
		}
	}
	return nil
}
