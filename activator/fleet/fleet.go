// Package fleet lets several gateways serve one platform. One of them, the
// leader, runs the scaler, reconcile and the runtimes; its Publisher sits
// between reconcile and the leader's activator and records every routable
// replica and canary share in the shared state store. Every other gateway
// runs a Follower: it applies what the leader published to its own
// activator (so each gateway proxies straight to the replicas), resolves
// deployments from the store, and reports its requests in flight per
// deployment, which the Publisher adds to the leader's own when reconcile
// asks how loaded a deployment is. A follower's request for a model with
// no replica waits in its buffer until the leader, seeing that load,
// starts one and publishes it.
package fleet

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/scaler/reconcile"
)

// DefaultInterval is how often a follower syncs and the publisher reads
// the followers' load.
const DefaultInterval = 500 * time.Millisecond

// staleAfter is how old a gateway's load report may be and still count:
// a gateway that stopped reporting has no requests.
const staleAfter = 5 * time.Second

// Store is the shared state the gateways meet in (internal/store).
type Store interface {
	PutEndpoint(ctx context.Context, e store.Endpoint) error
	DeleteEndpoint(ctx context.Context, deployment, replica string) error
	SetCanaryShare(ctx context.Context, c store.CanaryShare) error
	ClearFleet(ctx context.Context) error
	Fleet(ctx context.Context) ([]store.Endpoint, []store.CanaryShare, error)
	ReportLoad(ctx context.Context, gateway string, load map[string]float64) error
	Load(ctx context.Context, except string, maxAge time.Duration) (map[string]float64, error)
}

// Publisher is the leader's reconcile.Router: the leader's activator, with
// every change recorded for the followers, and the followers' load added
// to the leader's.
type Publisher struct {
	reconcile.Router
	st       Store
	gateway  string
	interval time.Duration
	log      *slog.Logger

	mu     sync.Mutex
	others map[string]float64 // the followers' load by deployment
}

// NewPublisher publishes local's routing through st as gateway.
func NewPublisher(local reconcile.Router, st Store, gateway string, log *slog.Logger) *Publisher {
	if log == nil {
		log = slog.Default()
	}
	return &Publisher{Router: local, st: st, gateway: gateway, interval: DefaultInterval, log: log.With("component", "fleet-publisher")}
}

// Clear removes what an earlier leader published, before this one
// publishes its own replicas.
func (p *Publisher) Clear(ctx context.Context) error { return p.st.ClearFleet(ctx) }

// AddReplica routes to a replica here and publishes it.
func (p *Publisher) AddReplica(deployment, id, addr string, capacity int) {
	p.Router.AddReplica(deployment, id, addr, capacity)
	p.write("publish a replica", func(ctx context.Context) error {
		return p.st.PutEndpoint(ctx, store.Endpoint{Deployment: deployment, Replica: id, Addr: addr, Capacity: capacity})
	})
}

// RemoveReplica unpublishes a replica first, so the followers stop
// sending it requests, then drains it here.
func (p *Publisher) RemoveReplica(ctx context.Context, deployment, id string) {
	p.write("unpublish a replica", func(ctx context.Context) error { return p.st.DeleteEndpoint(ctx, deployment, id) })
	p.Router.RemoveReplica(ctx, deployment, id)
}

// SetCanary sets a canary share here and publishes it.
func (p *Publisher) SetCanary(deployment, pool string, percent int) {
	p.Router.SetCanary(deployment, pool, percent)
	p.write("publish a canary share", func(ctx context.Context) error {
		return p.st.SetCanaryShare(ctx, store.CanaryShare{Deployment: deployment, Pool: pool, Percent: percent})
	})
}

// Concurrency is the deployment's requests in flight and buffered on
// every gateway.
func (p *Publisher) Concurrency(deployment string) float64 {
	p.mu.Lock()
	others := p.others[deployment]
	p.mu.Unlock()
	return p.Router.Concurrency(deployment) + others
}

// Run reads the followers' load every interval until ctx ends.
func (p *Publisher) Run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		load, err := p.st.Load(ctx, p.gateway, staleAfter)
		if err != nil && ctx.Err() == nil {
			p.log.Warn("read the followers' load", "err", err)
		} else if err == nil {
			p.mu.Lock()
			p.others = load
			p.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// write runs a store write with a bound, logging a failure: routing here
// goes on, and followers catch up at the next change.
func (p *Publisher) write(what string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fn(ctx); err != nil {
		p.log.Warn(what, "err", err)
	}
}
