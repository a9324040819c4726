package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/activator/fleet"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/scaler/reconcile"
)

// sharedRefresh is how often a gateway on shared state rereads keys and
// limits that other gateways changed.
const sharedRefresh = 5 * time.Second

// fleetFlags configure several gateways: shared state, shared limit
// counters, and which of them leads.
type fleetFlags struct {
	state, limitsURL, identity string
	leaderElect                bool
	lease, renew, retry        time.Duration
	leaseName                  string
}

func (g *fleetFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&g.state, "state", "", "the state store: postgres://… shared by several gateways (default: SQLite at DATA/state.db)")
	fl.StringVar(&g.limitsURL, "limits", "", "Redis of the tenancy limits' counters, shared by several gateways: redis://host:port/db (default: in this process)")
	fl.BoolVar(&g.leaderElect, "leader-elect", false, "run the scaler, reconcile and the runtimes only while holding a Kubernetes Lease; other gateways serve /v1 on what the leader publishes (needs --state postgres://…)")
	fl.DurationVar(&g.lease, "leader-elect-lease-duration", 15*time.Second, "how long a leader's Lease holds without renewal; a new leader takes over after it")
	fl.DurationVar(&g.renew, "leader-elect-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew before it steps down")
	fl.DurationVar(&g.retry, "leader-elect-retry-period", 2*time.Second, "time between two tries to acquire or renew the Lease")
	fl.StringVar(&g.leaseName, "leader-elect-resource-name", "stoke-gateway", "the Lease's name (in --kube-namespace)")
	fl.StringVar(&g.identity, "gateway-id", "", "this gateway's name in the Lease and the shared state (default: $POD_NAME, else HOST-PID)")
}

// check refuses flags that cannot work together.
func (g *fleetFlags) check() error {
	if g.leaderElect && g.state == "" {
		return errors.New("--leader-elect needs shared state: --state postgres://…")
	}
	if g.renew >= g.lease || g.retry >= g.renew || g.retry <= 0 {
		return fmt.Errorf("--leader-elect-*: want retry period (%v) < renew deadline (%v) < lease duration (%v)", g.retry, g.renew, g.lease)
	}
	return nil
}

// id is this gateway's identity.
func (g *fleetFlags) id() string {
	if g.identity != "" {
		return g.identity
	}
	if name := os.Getenv("POD_NAME"); name != "" {
		return name
	}
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(os.Getpid())
}

// redis is the client of --limits, nil without it.
func (g *fleetFlags) redis() (redis.UniversalClient, error) {
	if g.limitsURL == "" {
		return nil, nil
	}
	opt, err := redis.ParseURL(g.limitsURL)
	if err != nil {
		return nil, fmt.Errorf("--limits: want redis://host:port/db: %w", err)
	}
	return redis.NewClient(opt), nil
}

// run follows the leader until this gateway acquires the Lease, then runs
// the control plane behind a Publisher until ctx ends. Losing the Lease
// is an error: the process exits and comes back as a follower, so that no
// two control planes run at once.
func (g *fleetFlags) run(ctx context.Context, kube *kubeFlags, st *store.Store, act *activator.Activator, late *lateController, control *controlPlane) error {
	cfg, err := kube.restConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("leader election: kubernetes client: %w", err)
	}
	id := g.id()
	log := slog.Default().With("component", "leader-election", "gateway", id)
	follower := fleet.NewFollower(act, st, st, id, slog.Default())
	late.setFollower(follower)
	followCtx, stopFollowing := context.WithCancel(ctx)
	followed := make(chan struct{})
	go func() { defer close(followed); follower.Run(followCtx) }()

	// lost carries the first reason this gateway must stop; later ones
	// (a failed start, then the Lease's loss) are dropped.
	lost := make(chan error, 1)
	stopWith := func(err error) {
		select {
		case lost <- err:
		default:
		}
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: g.leaseName, Namespace: kube.ns()},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: g.lease, RenewDeadline: g.renew, RetryPeriod: g.retry, ReleaseOnCancel: true, Name: g.leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("leading: starting the control plane")
				stopFollowing()
				<-followed
				follower.Release(ctx)
				pub := fleet.NewPublisher(act, st, id, slog.Default())
				if err := pub.Clear(ctx); err != nil {
					stopWith(fmt.Errorf("leader: clear the previous leader's replicas: %w", err))
					return
				}
				go pub.Run(ctx)
				late.setFollower(nil)
				if err := control.start(ctx, pub); err != nil {
					stopWith(fmt.Errorf("leader: start the control plane: %w", err))
				}
			},
			OnStoppedLeading: func() {
				if ctx.Err() == nil {
					stopWith(errors.New("lost the leader Lease; exiting so that a single control plane runs"))
				}
			},
			OnNewLeader: func(leader string) { log.Info("leader", "leader", leader) },
		},
	})
	if err != nil {
		stopFollowing()
		return fmt.Errorf("leader election: %w", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); le.Run(ctx) }()
	select {
	case err := <-lost:
		return err
	case <-done:
		stopFollowing()
		<-followed
		select {
		case err := <-lost:
			return err
		default:
		}
		return ctx.Err()
	}
}

// errNotLeader answers a change only the leader makes, on a follower.
var errNotLeader = openai.Unavailable("this gateway does not lead the control plane; send the change to the leader (see the Lease)")

// follower returns the follower serve resolves through while it does not
// lead, nil otherwise.
func (l *lateController) follower() *fleet.Follower { return l.f.Load() }

// setFollower sets (nil: clears) the follower.
func (l *lateController) setFollower(f *fleet.Follower) { l.f.Store(f) }

// setManager sets the runtime manager /admin/runtimes lists.
func (l *lateController) setManager(m *runtime.Manager) { l.m.Store(m) }

// runtimesHandler serves /admin/runtimes from the manager once there is
// one (on the leader).
func (l *lateController) runtimesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := l.m.Load()
		if m == nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(errNotLeader.Status)
			json.NewEncoder(w).Encode(errNotLeader.Body())
			return
		}
		m.RuntimesHandler().ServeHTTP(w, r)
	})
}

// Deployments implements api.Deployments.
func (l *lateController) Deployments(ctx context.Context) ([]store.Deployment, error) {
	return l.st.Deployments(ctx)
}

// Deployment implements api.Deployments.
func (l *lateController) Deployment(ctx context.Context, name string) (store.Deployment, error) {
	return l.st.Deployment(ctx, name)
}

// UpdateSpec implements api.Deployments.
func (l *lateController) UpdateSpec(ctx context.Context, name string, raw json.RawMessage) (store.Deployment, error) {
	if c := l.c.Load(); c != nil {
		return c.UpdateSpec(ctx, name, raw)
	}
	return store.Deployment{}, errNotLeader
}

// Status implements api.Deployments.
func (l *lateController) Status(name string) (reconcile.Status, bool) {
	if c := l.c.Load(); c != nil {
		return c.Status(name)
	}
	return reconcile.Status{}, false
}

// Rollouts implements api.Deployments.
func (l *lateController) Rollouts(ctx context.Context, name string) ([]store.Rollout, error) {
	if c := l.c.Load(); c != nil {
		return c.Rollouts(ctx, name)
	}
	return nil, errNotLeader
}

// Promote implements api.Deployments.
func (l *lateController) Promote(ctx context.Context, name string) (store.Rollout, error) {
	if c := l.c.Load(); c != nil {
		return c.Promote(ctx, name)
	}
	return store.Rollout{}, errNotLeader
}

// Rollback implements api.Deployments.
func (l *lateController) Rollback(ctx context.Context, name string) (store.Rollout, error) {
	if c := l.c.Load(); c != nil {
		return c.Rollback(ctx, name)
	}
	return store.Rollout{}, errNotLeader
}

// Pin implements api.Deployments.
func (l *lateController) Pin(ctx context.Context, name, revision string) (store.Deployment, error) {
	if c := l.c.Load(); c != nil {
		return c.Pin(ctx, name, revision)
	}
	return store.Deployment{}, errNotLeader
}

// Unpin implements api.Deployments.
func (l *lateController) Unpin(ctx context.Context, name string) (store.Deployment, error) {
	if c := l.c.Load(); c != nil {
		return c.Unpin(ctx, name)
	}
	return store.Deployment{}, errNotLeader
}

// Prepare implements api.ColdStarts.
func (l *lateController) Prepare(ctx context.Context, name string, want tier.Tier) error {
	if c := l.c.Load(); c != nil {
		return c.Prepare(ctx, name, want)
	}
	return errNotLeader
}

// Acquisition implements api.ColdStarts.
func (l *lateController) Acquisition(name, id string) (*runtime.Replica, bool) {
	if c := l.c.Load(); c != nil {
		return c.Acquisition(name, id)
	}
	return nil, false
}

// Adapter implements activator.AdapterResolver.
func (l *lateController) Adapter(deployment, name string) (engineapi.LoadAdapterRequest, bool) {
	if c := l.c.Load(); c != nil {
		return c.Adapter(deployment, name)
	}
	if f := l.follower(); f != nil {
		return f.Adapter(deployment, name)
	}
	return engineapi.LoadAdapterRequest{}, false
}

// Adapters implements api.AdapterLister.
func (l *lateController) Adapters(deployment string) []string {
	if c := l.c.Load(); c != nil {
		return c.Adapters(deployment)
	}
	if f := l.follower(); f != nil {
		return f.Adapters(deployment)
	}
	return nil
}
