package activator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
)

// RouteStore keeps the routes set through the admin API (the state
// store).
type RouteStore interface {
	Routes(ctx context.Context) ([]store.StoredRoute, error)
	PutRoute(ctx context.Context, name string, spec json.RawMessage) (store.StoredRoute, error)
	DeleteRoute(ctx context.Context, name string) error
}

// RouteBook owns the routes in effect: those of the routes file
// (read-only, and the only place providers are defined, since their keys
// live on the serving host) and those set through the admin API (kept in
// the store). Every change is validated against the whole set and the
// deployments before it takes effect; the activator then routes by a
// compiled copy swapped in whole.
type RouteBook struct {
	a   *Activator
	st  RouteStore
	log *slog.Logger

	file      config.Routes
	providers map[string]*provider

	mu  sync.Mutex
	api map[string]config.Route
}

// NewRouteBook puts the routes file's routes and providers and the
// stored routes in effect on a. A file that does not validate, or a
// provider whose key cannot be read, is an error; a stored route that no
// longer validates is left out with a warning. At start a name that is
// neither a route nor a provider is taken for a deployment (the bucket
// may not have been read yet), with a warning when none has that name;
// a request routed to it falls back, or answers model_not_found.
func NewRouteBook(ctx context.Context, a *Activator, st RouteStore, file config.Routes, log *slog.Logger) (*RouteBook, error) {
	if log == nil {
		log = slog.Default()
	}
	b := &RouteBook{a: a, st: st, log: log, file: file, providers: map[string]*provider{}, api: map[string]config.Route{}}
	if err := file.Validate(b.lenient(file)); err != nil {
		return nil, fmt.Errorf("routes file: %w", err)
	}
	for _, p := range file.Providers {
		pr, err := newProvider(p, a.opts.ProviderBreaker)
		if err != nil {
			return nil, fmt.Errorf("routes file: %w", err)
		}
		b.providers[p.Name] = pr
	}
	stored, err := st.Routes(ctx)
	if err != nil {
		return nil, fmt.Errorf("load routes: %w", err)
	}
	for _, sr := range stored {
		r, err := config.ParseRoute(sr.Spec)
		if err == nil && b.fromFile(sr.Name) {
			err = fmt.Errorf("the routes file defines %q too", sr.Name)
		}
		if err == nil {
			candidate := b.withLocked(r, "")
			err = candidate.Validate(b.lenient(candidate))
		}
		if err != nil {
			log.Warn("a stored route is left out", "route", sr.Name, "err", err)
			continue
		}
		b.api[r.Name] = r
	}
	b.applyLocked()
	return b, nil
}

// lenient is the start's isDeployment over rs (see NewRouteBook).
func (b *RouteBook) lenient(rs config.Routes) func(string) bool {
	return func(name string) bool {
		if slices.ContainsFunc(rs.Routes, func(r config.Route) bool { return r.Name == name }) ||
			slices.ContainsFunc(rs.Providers, func(p config.Provider) bool { return p.Name == name }) {
			return false
		}
		if !b.isDeployment(name) {
			b.log.Warn("a route names what is not a deployment yet", "name", name)
		}
		return true
	}
}

// isDeployment reports whether name is a deployment.
func (b *RouteBook) isDeployment(name string) bool {
	_, _, ok := b.a.opts.Resolver.Lookup(name)
	return ok
}

// Routes returns the routes in effect and the providers, each ordered by
// name (a copy).
func (b *RouteBook) Routes() config.Routes {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.withLocked(config.Route{}, "")
}

// FromFile reports whether the routes file defines route name.
func (b *RouteBook) FromFile(name string) bool { return b.fromFile(name) }

func (b *RouteBook) fromFile(name string) bool {
	return slices.ContainsFunc(b.file.Routes, func(r config.Route) bool { return r.Name == name })
}

// PutRoute validates r against the other routes and the deployments,
// stores it and puts it in effect. Errors wrap config.ErrRouteInvalid or
// config.ErrRouteFromFile.
func (b *RouteBook) PutRoute(ctx context.Context, r config.Route) error {
	if b.fromFile(r.Name) {
		return fmt.Errorf("%w: change %q in the routes file", config.ErrRouteFromFile, r.Name)
	}
	if err := r.Check(); err != nil {
		return fmt.Errorf("%w: %v", config.ErrRouteInvalid, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.withLocked(r, "").Validate(b.isDeployment); err != nil {
		return fmt.Errorf("%w: %v", config.ErrRouteInvalid, err)
	}
	spec, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("put route %s: %w", r.Name, err)
	}
	if _, err := b.st.PutRoute(ctx, r.Name, spec); err != nil {
		return fmt.Errorf("put route %s: %w", r.Name, err)
	}
	b.api[r.Name] = r
	b.applyLocked()
	return nil
}

// DeleteRoute takes route name out of effect and out of the store, unless
// another route still points to it. Errors: store.ErrNotFound, or
// wrapping config.ErrRouteFromFile or config.ErrRouteInvalid.
func (b *RouteBook) DeleteRoute(ctx context.Context, name string) error {
	if b.fromFile(name) {
		return fmt.Errorf("%w: remove %q from the routes file", config.ErrRouteFromFile, name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.api[name]; !ok {
		return fmt.Errorf("delete route %s: %w", name, store.ErrNotFound)
	}
	if err := b.withLocked(config.Route{}, name).Validate(b.isDeployment); err != nil {
		return fmt.Errorf("%w: %v", config.ErrRouteInvalid, err)
	}
	if err := b.st.DeleteRoute(ctx, name); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete route %s: %w", name, err)
	}
	delete(b.api, name)
	b.applyLocked()
	return nil
}

// withLocked is the whole set with put (when named) in place of its
// namesake and without the route named drop; b.mu is held.
func (b *RouteBook) withLocked(put config.Route, drop string) config.Routes {
	out := config.Routes{Routes: slices.Clone(b.file.Routes), Providers: slices.Clone(b.file.Providers)}
	for name, r := range b.api {
		if name != put.Name && name != drop {
			out.Routes = append(out.Routes, r)
		}
	}
	if put.Name != "" {
		out.Routes = append(out.Routes, put)
	}
	slices.SortFunc(out.Routes, func(x, y config.Route) int { return strings.Compare(x.Name, y.Name) })
	slices.SortFunc(out.Providers, func(x, y config.Provider) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// applyLocked compiles the set and swaps it into the activator; b.mu is
// held.
func (b *RouteBook) applyLocked() {
	b.a.routes.Store(compileRoutes(b.withLocked(config.Route{}, ""), b.providers))
}
