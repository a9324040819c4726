package activator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"

	"golang.org/x/sync/singleflight"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/openai"
)

// AdapterResolver is a Resolver that also knows the LoRA adapters pushed
// under deployments' models: a request for "BASE:ADAPTER" is served by
// BASE's replicas with the adapter applied.
type AdapterResolver interface {
	// Adapter returns what an engine loads to serve adapter name of
	// deployment (its bucket prefix and pinned revision).
	Adapter(deployment, name string) (engineapi.LoadAdapterRequest, bool)
}

// DefaultAdapterSlots is PoolOptions.AdapterSlots when unset: the engine's
// default --max-loras.
const DefaultAdapterSlots = 8

// Adapter affinity of a replica for a request's adapter, best first
// (AIBrix and llm-d score them 1.0, 0.8 and 0.6).
const (
	adapterNone    = iota // its slots are full of other adapters: one must go
	adapterLoading        // a request for it is on its way there, not yet answered
	adapterFree           // a slot is free for it
	adapterLoaded         // it answered a request with it: the weights are there
)

// adapterSet is what the pool believes one replica holds of adapters: the
// engine keeps its slots in LRU order, and so does this, from the
// requests routed there and answered. Guarded by Pool.mu.
type adapterSet struct {
	lru     []string       // loaded, least recently used first
	loading map[string]int // requests in flight for adapters not yet loaded
}

// affinity is how well the replica suits adapter with slots slots.
func (s *adapterSet) affinity(adapter string, slots int) int {
	for _, a := range s.lru {
		if a == adapter {
			return adapterLoaded
		}
	}
	switch {
	case s.loading[adapter] > 0:
		return adapterLoading
	case len(s.lru)+len(s.loading) < slots:
		return adapterFree
	}
	return adapterNone
}

// routed counts a request for adapter on its way to the replica.
func (s *adapterSet) routed(adapter string) {
	if s.loading == nil {
		s.loading = map[string]int{}
	}
	s.loading[adapter]++
}

// answered ends a routed request: a success means the engine has the
// adapter in a slot, now its most recently used, and evicted its least
// recently used one past slots.
func (s *adapterSet) answered(adapter string, ok bool, slots int) {
	if n := s.loading[adapter] - 1; n > 0 {
		s.loading[adapter] = n
	} else {
		delete(s.loading, adapter)
	}
	if !ok {
		return
	}
	for i, a := range s.lru {
		if a == adapter {
			s.lru = append(s.lru[:i], s.lru[i+1:]...)
			break
		}
	}
	s.lru = append(s.lru, adapter)
	if len(s.lru) > slots {
		s.lru = s.lru[len(s.lru)-slots:]
	}
}

// byAdapter keeps, of cands, those with the best affinity for adapter
// among the candidates within the load slack of the least loaded one,
// so adapter affinity never piles requests on one replica; prefix
// affinity and load then choose among them.
func (p *Pool) byAdapter(cands []Candidate, adapter string) []Candidate {
	if adapter == "" || len(cands) < 2 {
		return cands
	}
	least := cands[0].InFlight
	for _, c := range cands[1:] {
		least = min(least, c.InFlight)
	}
	best := -1
	for i := range cands {
		c := &cands[i]
		if c.InFlight-least > p.prefix.slack(c.Capacity) {
			c.adapter = -1
			continue
		}
		c.adapter = c.rep.adapters.affinity(adapter, p.adapterSlots)
		best = max(best, c.adapter)
	}
	n := 0
	for i := range cands {
		if cands[i].adapter == best {
			cands[n], cands[i] = cands[i], cands[n]
			n++
		}
	}
	return cands[:n]
}

// adapterRegistry remembers which adapters each replica's engine has been
// told of, so an engine hears of an adapter revision once.
type adapterRegistry struct {
	mu    sync.Mutex
	known map[string]map[engineapi.LoadAdapterRequest]bool // replica id → adapters registered
	calls singleflight.Group
}

// forget drops what the registry knows of a replica.
func (g *adapterRegistry) forget(replica string) {
	g.mu.Lock()
	delete(g.known, replica)
	g.mu.Unlock()
}

// ensureAdapter registers ad with the engine of replica at addr unless it
// was already. A refusal by the engine (a 4xx: the adapter does not fit the
// base, its files are bad) comes back as an *openai.Error for the client;
// any other failure is the replica's.
func (a *Activator) ensureAdapter(ctx context.Context, r *route, replica, addr string, ad engineapi.LoadAdapterRequest) error {
	g := &r.adapters
	g.mu.Lock()
	done := g.known[replica][ad]
	g.mu.Unlock()
	if done {
		return nil
	}
	key := replica + "\x00" + ad.Name + "\x00" + ad.Path + "\x00" + ad.Revision
	_, err, _ := g.calls.Do(key, func() (any, error) {
		err := a.registerAdapter(ctx, addr, ad)
		if errors.Is(err, errAdapterTaken) {
			// The engine holds another revision under the name: swap it
			// once no request uses it, and serve the one it has until then
			// (a later request tries again).
			switch uerr := a.unregisterAdapter(ctx, addr, ad.Name); {
			case uerr == nil:
				err = a.registerAdapter(ctx, addr, ad)
			case errors.Is(uerr, errAdapterTaken):
				return nil, nil
			default:
				err = uerr
			}
		}
		if err != nil {
			return nil, err
		}
		g.mu.Lock()
		if g.known == nil {
			g.known = map[string]map[engineapi.LoadAdapterRequest]bool{}
		}
		if g.known[replica] == nil {
			g.known[replica] = map[engineapi.LoadAdapterRequest]bool{}
		}
		g.known[replica][ad] = true
		g.mu.Unlock()
		return nil, nil
	})
	return err
}

// errAdapterTaken is an engine's 409 for an adapter: the name holds
// another revision (a registration), or requests use it (an unload).
var errAdapterTaken = errors.New("the engine's adapter of that name is taken")

// registerAdapter sends POST /admin/adapters to the engine at addr.
func (a *Activator) registerAdapter(ctx context.Context, addr string, ad engineapi.LoadAdapterRequest) error {
	body, err := json.Marshal(ad)
	if err != nil {
		return fmt.Errorf("register adapter %s: %w", ad.Name, err)
	}
	return a.adapterCall(ctx, addr, http.MethodPost, "/admin/adapters", body, ad.Name)
}

// unregisterAdapter sends DELETE /admin/adapters/NAME to the engine at
// addr; an adapter it does not know is no error.
func (a *Activator) unregisterAdapter(ctx context.Context, addr, name string) error {
	err := a.adapterCall(ctx, addr, http.MethodDelete, "/admin/adapters/"+url.PathEscape(name), nil, name)
	var e *openai.Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound {
		return nil
	}
	return err
}

// adapterCall makes one call of an engine's adapter API. A 409 is
// errAdapterTaken, another 4xx an *openai.Error for the client (the
// adapter does not fit the base, its files are bad), anything else the
// replica's failure.
func (a *Activator) adapterCall(ctx context.Context, addr, method, path string, body []byte, name string) error {
	rt, base := a.tr.For(addr)
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("adapter %s: %w", name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("%s %s on the engine: %w", method, path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusConflict:
		return fmt.Errorf("%w: %s", errAdapterTaken, bytes.TrimSpace(msg))
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(msg, &e) == nil && e.Error.Message != "" {
			return &openai.Error{Status: resp.StatusCode, Type: openai.TypeInvalidRequest, Code: "adapter_invalid", Param: "model",
				Message: "adapter " + name + " cannot be served: " + e.Error.Message}
		}
		return &openai.Error{Status: resp.StatusCode, Type: openai.TypeInvalidRequest, Code: "adapter_invalid", Param: "model",
			Message: "adapter " + name + " cannot be served: " + string(bytes.TrimSpace(msg))}
	}
	return fmt.Errorf("%s %s on the engine: %s: %s", method, path, resp.Status, bytes.TrimSpace(msg))
}
