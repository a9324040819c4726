package reconcile

// The LoRA adapters pushed under deployments' models: what the activator
// resolves "BASE:ADAPTER" to, and what /v1/models lists.

import (
	"slices"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/store"
)

// setAdapter makes revision r of adapter name of model base the one its
// requests are served with.
func (c *Controller) setAdapter(base, name string, r store.Revision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.adapters == nil {
		c.adapters = map[string]map[string]engineapi.LoadAdapterRequest{}
	}
	if c.adapters[base] == nil {
		c.adapters[base] = map[string]engineapi.LoadAdapterRequest{}
	}
	prev, had := c.adapters[base][name]
	c.adapters[base][name] = engineapi.LoadAdapterRequest{Name: name, Path: r.Source, Revision: r.Digest}
	if !had || prev.Revision != r.Digest {
		c.log.Info("adapter serves a new revision", "model", base, "adapter", name, "revision", r.Digest)
	}
}

// Adapter implements activator.AdapterResolver: what the engines of
// deployment load to serve its adapter name.
func (c *Controller) Adapter(deployment, name string) (engineapi.LoadAdapterRequest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deps[deployment]
	if !ok {
		return engineapi.LoadAdapterRequest{}, false
	}
	ad, ok := c.adapters[d.model][name]
	return ad, ok
}

// Adapters lists, sorted, the adapters of deployment's model.
func (c *Controller) Adapters(deployment string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deps[deployment]
	if !ok {
		return nil
	}
	names := make([]string, 0, len(c.adapters[d.model]))
	for n := range c.adapters[d.model] {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
