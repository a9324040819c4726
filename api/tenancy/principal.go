package tenancy

import (
	"context"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/openai"
)

// Principal is who a request authenticated as: a tenant's key, or the
// operator's admin key.
type Principal struct {
	// TenantID is the key's tenant ("" for the admin key).
	TenantID string
	// KeyID is the key's id ("" for the admin key).
	KeyID string
	// Models, when not empty, are the only models the key may use.
	Models []string
	// Admin is set for the admin key.
	Admin bool
	// Priority is the key's priority class ("" for the default).
	Priority string
}

// Priority classes a key may have: where its requests wait among others'
// (in the activator's buffer and the engine's scheduler). A batch key's
// requests wait behind every other interactive request but, unlike the
// batch runner's lines, are never preempted: they are a client's.
const (
	PriorityClassInteractive = "interactive"
	PriorityClassStandard    = "standard"
	PriorityClassBatch       = "batch"
)

// classPriority is a class's priority in the activator's bands.
func classPriority(class string) (int, bool) {
	switch class {
	case PriorityClassInteractive:
		return activator.PriorityInteractiveMax, true
	case PriorityClassStandard:
		return activator.PriorityInteractive, true
	case PriorityClassBatch:
		return activator.PriorityInteractiveMin, true
	}
	return 0, false
}

// Owner is the owner of what the principal creates (files, batches) and
// the only owner whose things it sees: its tenant's id. A request with no
// principal (auth is off) owns as "".
func Owner(ctx context.Context) string {
	p, _ := FromContext(ctx)
	return p.TenantID
}

// Allows reports whether the principal may use model.
func (p Principal) Allows(model string) bool {
	if len(p.Models) == 0 {
		return true
	}
	for _, m := range p.Models {
		if m == model {
			return true
		}
	}
	return false
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal ctx carries, if any.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// AuthorizeModel is the activator's check of a request's model against
// its key's scope: a model outside it is answered as OpenAI does one the
// key cannot see, 404 model_not_found (never revealing that it exists).
func AuthorizeModel(ctx context.Context, model string) *openai.Error {
	if p, ok := FromContext(ctx); ok && !p.Allows(model) {
		return openai.ModelNotFound(model)
	}
	return nil
}
