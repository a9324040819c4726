package activator

import (
	"maps"
	"strings"
)

// RevisionHeader names, on an answer, the revision of the deployment that
// served it.
const RevisionHeader = "X-Stoke-Revision"

// RevisionSep joins a deployment's name and a revision digest in a model
// name that pins a request to that revision ("chat@sha256:…"), served
// only while the deployment serves it (as its stable or its canary
// revision), never split between them.
const RevisionSep = "@"

// canary is one deployment's canary: the pool of replicas serving its
// candidate revision and their share of its requests.
type canary struct {
	pool    string
	percent int
}

// canaryTable is the canaries in effect, immutable: SetCanary swaps a new
// one in whole.
type canaryTable struct {
	byDeployment map[string]canary
	// deploymentOf is a canary pool's deployment, the model name its
	// engines serve.
	deploymentOf map[string]string
}

// SetCanary makes pool, whose replicas serve deployment's candidate
// revision, take percent of the requests to deployment; an empty pool
// ends deployment's canary. The replicas of pool are added and removed
// like any deployment's (AddReplica, RemoveReplica), under the name pool,
// which the Resolver resolves to the candidate's revision and spec.
func (a *Activator) SetCanary(deployment, pool string, percent int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.canaries.Load()
	next := &canaryTable{byDeployment: map[string]canary{}, deploymentOf: map[string]string{}}
	if old != nil {
		maps.Copy(next.byDeployment, old.byDeployment)
		maps.Copy(next.deploymentOf, old.deploymentOf)
		if c, ok := old.byDeployment[deployment]; ok {
			delete(next.deploymentOf, c.pool)
		}
	}
	delete(next.byDeployment, deployment)
	if pool != "" {
		next.byDeployment[deployment] = canary{pool: pool, percent: percent}
		next.deploymentOf[pool] = deployment
	}
	a.canaries.Store(next)
}

// split is the pool that serves one request to deployment: its canary's
// for the canary's share of them, else its own.
func (t *canaryTable) split(deployment string, rng func(n int) int) string {
	if t == nil {
		return deployment
	}
	c, ok := t.byDeployment[deployment]
	if !ok || c.percent <= 0 || rng(100) >= c.percent {
		return deployment
	}
	return c.pool
}

// deployment is the deployment pool belongs to (pool itself when it is
// no canary's).
func (t *canaryTable) deployment(pool string) string {
	if t != nil {
		if d, ok := t.deploymentOf[pool]; ok {
			return d
		}
	}
	return pool
}

// pinned resolves a model name that pins a revision ("chat@sha256:…")
// to the pool serving that revision of the deployment and the
// deployment's name; ok is false when name pins nothing (no RevisionSep,
// or a deployment or route whose own name holds one), and pool is empty
// when the deployment does not serve that revision now. A canary's pool
// is reached by its revision only, never by its own name.
func (a *Activator) pinned(name string) (pool, deployment string, ok bool) {
	deployment, revision, ok := strings.Cut(name, RevisionSep)
	if !ok {
		return "", "", false
	}
	if t := a.canaries.Load(); t != nil {
		if _, isPool := t.deploymentOf[name]; isPool {
			return "", deployment, true
		}
	}
	if _, _, known := a.opts.Resolver.Lookup(name); known {
		return "", "", false
	}
	if t := a.routes.Load(); t != nil && t.routes[name] != nil {
		return "", "", false
	}
	if rev, _, known := a.opts.Resolver.Lookup(deployment); known && rev == revision {
		return deployment, deployment, true
	}
	if t := a.canaries.Load(); t != nil {
		if c, found := t.byDeployment[deployment]; found {
			if rev, _, known := a.opts.Resolver.Lookup(c.pool); known && rev == revision {
				return c.pool, deployment, true
			}
		}
	}
	return "", deployment, true
}
