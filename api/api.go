// Package api is stoke's HTTP surface: the OpenAI-compatible /v1 endpoints
// clients call (served through the activator), the /admin endpoints
// operators use, and /metrics. Errors always have the OpenAI shape.
// Middleware runs in a fixed chain (request id, then the caller's, then the
// handlers), which is the seam tenancy (auth, limits, quotas) plugs into.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/batch/files"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/scaler/reconcile"
)

// Deployments is what the API lists and updates.
type Deployments interface {
	// Deployments lists every deployment.
	Deployments(ctx context.Context) ([]store.Deployment, error)
	// Deployment returns one, or an error wrapping store.ErrNotFound.
	Deployment(ctx context.Context, name string) (store.Deployment, error)
	// UpdateSpec replaces a deployment's spec after validating it.
	UpdateSpec(ctx context.Context, name string, spec json.RawMessage) (store.Deployment, error)
	// Status is a deployment's live state (false when it has none).
	Status(name string) (reconcile.Status, bool)
	// Rollouts lists a deployment's rollouts, newest first.
	Rollouts(ctx context.Context, name string) ([]store.Rollout, error)
	// Promote and Rollback end a deployment's canary by hand (an error
	// wrapping store.ErrNotFound when none runs).
	Promote(ctx context.Context, name string) (store.Rollout, error)
	Rollback(ctx context.Context, name string) (store.Rollout, error)
	// Pin makes a deployment serve revision whatever is pushed, until
	// Unpin.
	Pin(ctx context.Context, name, revision string) (store.Deployment, error)
	Unpin(ctx context.Context, name string) (store.Deployment, error)
}

// AdapterLister lists the LoRA adapters of deployments, which /v1/models
// shows as models of their own ("BASE:ADAPTER"). A Deployments that is
// one (reconcile.Controller) gets them listed.
type AdapterLister interface {
	// Adapters lists, sorted, the adapters of deployment.
	Adapters(deployment string) []string
}

// ColdStarts drives deployments into cold-start tiers and reports how
// their replicas were acquired (the cold-start bench's admin surface).
type ColdStarts interface {
	Prepare(ctx context.Context, name string, tier tier.Tier) error
	// Acquisition is how the replica on runtime id ("" for the latest)
	// was acquired.
	Acquisition(name, id string) (*runtime.Replica, bool)
}

// Options wire the API to the rest of the platform.
type Options struct {
	// Inference serves /v1/completions and /v1/chat/completions (the
	// activator).
	Inference http.Handler
	// Deployments backs /v1/models and /admin/deployments.
	Deployments Deployments
	// Runtimes serves GET /admin/runtimes; nil answers 404.
	Runtimes http.Handler
	// ColdStarts serves POST /admin/deployments/:name/prepare and GET
	// /admin/deployments/:name/acquisition; nil answers 404.
	ColdStarts ColdStarts
	// Registry is served at /metrics.
	Registry *prometheus.Registry
	// Middleware runs before every handler, after the request id (auth,
	// rate limits and quotas go here).
	Middleware []gin.HandlerFunc
	// MaxBodyBytes limits admin request bodies (default 1 MiB).
	MaxBodyBytes int64
	// Files serves /v1/files; nil leaves those routes unmounted (404).
	Files *files.Store
	// Batches serves /v1/batches; nil leaves those routes unmounted.
	Batches Batches
	// Tenancy authenticates keys and serves /admin/tenants and
	// /admin/keys; nil: no auth at all.
	Tenancy *tenancy.Service
	// Auth says when /v1 needs a key (with Tenancy set).
	Auth AuthMode
	// AdminOpen leaves /admin open without the admin key (a loopback
	// serve with no admin key); otherwise /admin takes the admin key.
	AdminOpen bool
	// Routes serves /admin/routes and adds routes to /v1/models; nil
	// leaves them out.
	Routes RouteAdmin
}

// New returns the API's handler.
func New(o Options) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 1 << 20
	}
	r := gin.New()
	r.Use(gin.Recovery(), requestID())
	if o.Tenancy != nil && o.Auth != AuthNone {
		r.Use(authenticate(o.Tenancy, o.Auth, o.AdminOpen))
	}
	r.Use(o.Middleware...)
	r.NoRoute(func(c *gin.Context) {
		writeError(c, openai.RouteNotFound(c.Request.Method, openai.Echo(c.Request.URL.Path)))
	})
	// A served path asked with another method is a 405; gin has set the
	// Allow header by the time NoMethod runs.
	r.HandleMethodNotAllowed = true
	r.NoMethod(func(c *gin.Context) {
		writeError(c, openai.MethodNotAllowed(c.Request.Method, c.Request.URL.Path, c.Writer.Header().Get("Allow")))
	})

	inference := gin.WrapH(o.Inference)
	r.POST("/v1/completions", inference)
	r.POST("/v1/chat/completions", inference)
	r.GET("/v1/models", o.listModels)
	// A catch-all, as model names may hold slashes ("org/name").
	r.GET("/v1/models/*id", o.getModel)
	if o.Files != nil {
		mountFiles(r, o.Files)
	}
	if o.Batches != nil {
		mountBatches(r, o.Batches, o.MaxBodyBytes)
	}
	if o.Tenancy != nil {
		mountTenancy(r, o.Tenancy, o.MaxBodyBytes)
		mountUsage(r, o.Tenancy)
	}
	r.GET("/health", func(c *gin.Context) { c.String(http.StatusOK, "ok") })

	r.GET("/admin/deployments", o.listDeployments)
	r.GET("/admin/deployments/:name", o.getDeployment)
	r.PUT("/admin/deployments/:name", o.putDeployment)
	mountRollouts(r, o) // rollouts.go
	if o.Runtimes != nil {
		r.GET("/admin/runtimes", gin.WrapH(o.Runtimes))
	}
	if o.Routes != nil {
		mountRoutes(r, o.Routes, o.MaxBodyBytes)
	}
	if o.ColdStarts != nil {
		r.POST("/admin/deployments/:name/prepare", o.prepare)
		r.GET("/admin/deployments/:name/acquisition", o.acquisition)
	}
	if o.Registry != nil {
		r.GET("/metrics", gin.WrapH(promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{})))
	}
	return r
}

// requestID gives every request an id (the client's X-Request-Id when it
// sent one, cut by openai.Echo), echoed in the response and passed on.
func requestID() gin.HandlerFunc {
	var seq atomic.Uint64
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	return func(c *gin.Context) {
		id := c.GetHeader("X-Request-Id")
		if e := openai.Echo(id); e != id {
			id = e
			c.Request.Header.Set("X-Request-Id", id)
		}
		if id == "" {
			id = prefix + "-" + strconv.FormatUint(seq.Add(1), 36)
			c.Request.Header.Set("X-Request-Id", id)
		}
		c.Header("X-Request-Id", id)
		c.Next()
	}
}

func (o Options) listModels(c *gin.Context) {
	ds, err := o.Deployments.Deployments(c.Request.Context())
	if err != nil {
		writeError(c, openai.ServerError("list models: %v", err))
		return
	}
	list := openai.ModelList{Object: openai.ObjectList, Data: []openai.Model{}}
	p, _ := tenancy.FromContext(c.Request.Context())
	adapters, _ := o.Deployments.(AdapterLister)
	for _, d := range ds {
		if p.Allows(d.Name) {
			list.Data = append(list.Data, modelObject(d))
		}
		if adapters == nil {
			continue
		}
		for _, a := range adapters.Adapters(d.Name) {
			if id := engineapi.AdapterModel(d.Name, a); p.Allows(id) {
				list.Data = append(list.Data, adapterModel(d, id))
			}
		}
	}
	if o.Routes != nil {
		taken := make(map[string]bool, len(ds))
		for _, d := range ds {
			taken[d.Name] = true
		}
		list.Data = append(list.Data, routeModels(c.Request.Context(), o.Routes, taken)...)
	}
	c.JSON(http.StatusOK, list)
}

// getModel serves GET /v1/models/{id}: the deployment id, else the route
// id, as an OpenAI Model object, or 404 model_not_found (an empty id lists
// the models, as /v1/models does).
func (o Options) getModel(c *gin.Context) {
	id := strings.TrimPrefix(c.Param("id"), "/")
	if id == "" {
		o.listModels(c)
		return
	}
	if e := tenancy.AuthorizeModel(c.Request.Context(), id); e != nil {
		writeError(c, e)
		return
	}
	d, err := o.Deployments.Deployment(c.Request.Context(), id)
	if base, adapter, ok := engineapi.SplitAdapterModel(id); ok && errors.Is(err, store.ErrNotFound) {
		if al, ok := o.Deployments.(AdapterLister); ok {
			if bd, berr := o.Deployments.Deployment(c.Request.Context(), base); berr == nil && hasAdapter(c.Request.Context(), al, base, adapter) {
				c.JSON(http.StatusOK, adapterModel(bd, id))
				return
			}
		}
	}
	if errors.Is(err, store.ErrNotFound) && o.Routes != nil {
		if _, ok := findRoute(o.Routes.Routes(), id); ok {
			c.JSON(http.StatusOK, routeModel(id))
			return
		}
	}
	if err != nil {
		writeError(c, deploymentError(id, err))
		return
	}
	c.JSON(http.StatusOK, modelObject(d))
}

// refresher is implemented by a Deployments whose view of the adapters
// can trail the shared state (a follower gateway's); Refresh reads the
// state again.
type refresher interface {
	Refresh(ctx context.Context)
}

// hasAdapter reports whether deployment has adapter, reading the state
// again once before it says no where the lister can trail it, as the
// activator does before it calls a model unknown.
func hasAdapter(ctx context.Context, al AdapterLister, deployment, adapter string) bool {
	if slices.Contains(al.Adapters(deployment), adapter) {
		return true
	}
	r, ok := al.(refresher)
	if !ok {
		return false
	}
	r.Refresh(ctx)
	return slices.Contains(al.Adapters(deployment), adapter)
}

// modelObject is a deployment as an OpenAI Model object.
func modelObject(d store.Deployment) openai.Model {
	return openai.Model{ID: d.Name, Object: openai.ObjectModel, Created: d.UpdatedAt.Unix(), OwnedBy: "stoke"}
}

// adapterModel is adapter id of deployment d as an OpenAI Model object,
// its parent the base (as vLLM lists LoRA adapters).
func adapterModel(d store.Deployment, id string) openai.Model {
	return openai.Model{ID: id, Object: openai.ObjectModel, Created: d.UpdatedAt.Unix(), OwnedBy: "stoke", Parent: d.Name}
}

// deploymentJSON is a deployment on the admin API. Spec is what was set,
// as stored; EffectiveSpec is what the platform serves it with: every
// field, defaults filled in. A stored spec that no longer parses (written
// before a rule it breaks) has no EffectiveSpec but a SpecError.
type deploymentJSON struct {
	Name          string            `json:"name"`
	Revision      string            `json:"revision"`
	Spec          json.RawMessage   `json:"spec"`
	EffectiveSpec *config.Spec      `json:"effective_spec,omitempty"`
	SpecError     string            `json:"spec_error,omitempty"`
	UpdatedAt     time.Time         `json:"updated_at"`
	Status        *reconcile.Status `json:"status,omitempty"`
	// Pinned is set while an operator pins the revision.
	Pinned bool `json:"pinned"`
	// Rollout is the latest rollout (in canary or ended), CanaryStatus
	// the live state of the canary's replicas while one runs.
	Rollout      *rolloutJSON      `json:"rollout,omitempty"`
	CanaryStatus *reconcile.Status `json:"canary_status,omitempty"`
}

func (o Options) toJSON(ctx context.Context, d store.Deployment) deploymentJSON {
	out := deploymentJSON{Name: d.Name, Revision: d.Revision, Spec: d.Spec, UpdatedAt: d.UpdatedAt, Pinned: d.Pinned}
	if rs, err := o.Deployments.Rollouts(ctx, d.Name); err == nil && len(rs) > 0 {
		r := toRolloutJSON(rs[0])
		out.Rollout = &r
		if st, ok := o.Deployments.Status(reconcile.CanaryPool(d.Name)); ok && rs[0].State == store.RolloutCanary {
			out.CanaryStatus = &st
		}
	}
	if eff, err := config.Parse(d.Spec); err != nil {
		out.SpecError = err.Error()
	} else {
		out.EffectiveSpec = &eff
	}
	if st, ok := o.Deployments.Status(d.Name); ok {
		out.Status = &st
	}
	return out
}

func (o Options) listDeployments(c *gin.Context) {
	ds, err := o.Deployments.Deployments(c.Request.Context())
	if err != nil {
		writeError(c, openai.ServerError("list deployments: %v", err))
		return
	}
	out := struct {
		Object string           `json:"object"`
		Data   []deploymentJSON `json:"data"`
	}{Object: "list", Data: []deploymentJSON{}}
	for _, d := range ds {
		out.Data = append(out.Data, o.toJSON(c.Request.Context(), d))
	}
	c.JSON(http.StatusOK, out)
}

func (o Options) getDeployment(c *gin.Context) {
	d, err := o.Deployments.Deployment(c.Request.Context(), c.Param("name"))
	if err != nil {
		writeError(c, deploymentError(c.Param("name"), err))
		return
	}
	c.JSON(http.StatusOK, o.toJSON(c.Request.Context(), d))
}

// putDeployment replaces a deployment's spec: the body is the spec, or an
// object with a "spec" field.
func (o Options) putDeployment(c *gin.Context) {
	body, e := o.readBody(c)
	if e != nil {
		writeError(c, e)
		return
	}
	var wrapped struct {
		Spec json.RawMessage `json:"spec"`
	}
	if e := openai.Decode(body, &wrapped); e != nil {
		writeError(c, e)
		return
	}
	spec := wrapped.Spec
	if spec == nil {
		spec = body
	}
	d, err := o.Deployments.UpdateSpec(c.Request.Context(), c.Param("name"), spec)
	if err != nil {
		writeError(c, deploymentError(c.Param("name"), err))
		return
	}
	c.JSON(http.StatusOK, o.toJSON(c.Request.Context(), d))
}

// readBody reads an admin request body of at most MaxBodyBytes.
func (o Options) readBody(c *gin.Context) ([]byte, *openai.Error) { return readBody(c, o.MaxBodyBytes) }

// readBody reads a request body of at most limit bytes: a Content-Length
// past it is refused (413) before any of it is read.
func readBody(c *gin.Context, limit int64) ([]byte, *openai.Error) {
	if c.Request.ContentLength > limit {
		return nil, openai.BodyTooLarge(limit)
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, openai.BodyTooLarge(limit)
		}
		return nil, openai.InvalidRequest("", "read request body: %v", err)
	}
	return body, nil
}

func deploymentError(name string, err error) *openai.Error {
	var e *openai.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, store.ErrNotFound):
		return openai.ModelNotFound(name)
	case errors.Is(err, store.ErrInvalid):
		return openai.InvalidRequest("spec", "%v", err)
	}
	return openai.ServerError("%v", err)
}

func writeError(c *gin.Context, e *openai.Error) {
	c.AbortWithStatusJSON(e.Status, e.Body())
}

func (o Options) prepare(c *gin.Context) {
	var req struct {
		Tier tier.Tier `json:"tier"`
	}
	body, e := o.readBody(c)
	if e != nil {
		writeError(c, e)
		return
	}
	if e := openai.Decode(body, &req); e != nil {
		writeError(c, e)
		return
	}
	if err := o.ColdStarts.Prepare(c.Request.Context(), c.Param("name"), req.Tier); err != nil {
		writeError(c, deploymentError(c.Param("name"), err))
		return
	}
	c.JSON(http.StatusOK, gin.H{"deployment": c.Param("name"), "tier": req.Tier, "prepared": true})
}

// acquisitionJSON is how a replica was acquired, on the admin API.
type acquisitionJSON struct {
	Runtime   string            `json:"runtime"`
	Tier      tier.Tier         `json:"tier"`
	LoadTier  tier.Tier         `json:"load_tier,omitempty"`
	Revision  string            `json:"revision"`
	Breakdown runtime.Breakdown `json:"breakdown"`
}

func (o Options) acquisition(c *gin.Context) {
	rep, ok := o.ColdStarts.Acquisition(c.Param("name"), c.Query("runtime"))
	if !ok {
		writeError(c, openai.NotFound("deployment %s has acquired no replica yet", c.Param("name")))
		return
	}
	c.JSON(http.StatusOK, acquisitionJSON{Runtime: rep.ID, Tier: rep.Tier, LoadTier: rep.LoadTier, Revision: rep.Revision, Breakdown: rep.Breakdown})
}
