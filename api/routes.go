package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

// RouteAdmin backs /admin/routes and lists routes in /v1/models (activator.RouteBook is one).
type RouteAdmin interface {
	// Routes returns the routes and providers in effect, each ordered by
	// name, in slices of the caller's own.
	Routes() config.Routes
	// FromFile reports whether the routes file defines the named route (read-only here).
	FromFile(name string) bool
	// PutRoute validates r against the rest and puts it in effect (errors wrap config.ErrRouteInvalid or config.ErrRouteFromFile).
	PutRoute(ctx context.Context, r config.Route) error
	// DeleteRoute takes a route out (store.ErrNotFound when there is none; config.ErrRouteFromFile for a file's).
	DeleteRoute(ctx context.Context, name string) error
}

// Where a route on the admin API comes from.
const (
	// RouteSourceFile is a route the routes file defines (read-only).
	RouteSourceFile = "file"
	// RouteSourceAPI is a route put through the admin API.
	RouteSourceAPI = "api"
)

// RouteJSON is a route on the admin API: the route as config.Route
// writes it, and where it comes from (RouteSourceFile or RouteSourceAPI).
type RouteJSON struct {
	config.Route
	Source string `json:"source"`
}

// RouteListJSON is GET /admin/routes: every route in effect, by name,
// and the providers their fallbacks may name.
type RouteListJSON struct {
	Object    string            `json:"object"`
	Data      []RouteJSON       `json:"data"`
	Providers []config.Provider `json:"providers"`
}

// mountRoutes serves /admin/routes from ra; names may hold slashes, hence
// the catch-alls.
func mountRoutes(r *gin.Engine, ra RouteAdmin, limit int64) {
	h := routeHandlers{ra: ra, limit: limit}
	r.GET("/admin/routes", h.list)
	r.GET("/admin/routes/*name", h.get)
	r.PUT("/admin/routes/*name", h.put)
	r.DELETE("/admin/routes/*name", h.delete)
}

type routeHandlers struct {
	ra    RouteAdmin
	limit int64
}

func (h routeHandlers) json(rt config.Route) RouteJSON {
	src := RouteSourceAPI
	if h.ra.FromFile(rt.Name) {
		src = RouteSourceFile
	}
	return RouteJSON{Route: rt, Source: src}
}

func (h routeHandlers) list(c *gin.Context) {
	rs := h.ra.Routes()
	out := RouteListJSON{Object: openai.ObjectList, Data: []RouteJSON{}, Providers: []config.Provider{}}
	for _, rt := range rs.Routes {
		out.Data = append(out.Data, h.json(rt))
	}
	out.Providers = append(out.Providers, rs.Providers...)
	c.JSON(http.StatusOK, out)
}

func (h routeHandlers) get(c *gin.Context) {
	name := strings.TrimPrefix(c.Param("name"), "/")
	if name == "" {
		h.list(c)
		return
	}
	rt, ok := findRoute(h.ra.Routes(), name)
	if !ok {
		writeError(c, routeNotFound(name))
		return
	}
	c.JSON(http.StatusOK, h.json(rt))
}

// put puts the body's route in effect under the path's name; the body
// may leave out "name" but must not give another.
func (h routeHandlers) put(c *gin.Context) {
	name := strings.TrimPrefix(c.Param("name"), "/")
	body, e := readBody(c, h.limit)
	if e != nil {
		writeError(c, e)
		return
	}
	var fields map[string]json.RawMessage
	if e := openai.Decode(body, &fields); e != nil {
		writeError(c, e)
		return
	}
	if fields == nil {
		writeError(c, openai.InvalidRequest("", "request body must be a JSON object holding a route"))
		return
	}
	if raw, ok := fields["name"]; ok {
		var given string
		if err := json.Unmarshal(raw, &given); err != nil || given != name {
			writeError(c, openai.InvalidRequest("name", "name %s differs from the path's %q: leave it out or make them equal",
				openai.Echo(string(raw)), openai.Echo(name)))
			return
		}
	}
	fields["name"], _ = json.Marshal(name)
	raw, err := json.Marshal(fields)
	if err != nil {
		writeError(c, openai.ServerError("put route %s: %v", openai.Echo(name), err))
		return
	}
	rt, err := config.ParseRoute(raw)
	if err != nil {
		writeError(c, openai.InvalidRequest("", "%v", err))
		return
	}
	if err := h.ra.PutRoute(c.Request.Context(), rt); err != nil {
		writeError(c, routeError(name, err))
		return
	}
	c.JSON(http.StatusOK, h.json(rt))
}

func (h routeHandlers) delete(c *gin.Context) {
	name := strings.TrimPrefix(c.Param("name"), "/")
	if name == "" {
		writeError(c, routeNotFound(name))
		return
	}
	if err := h.ra.DeleteRoute(c.Request.Context(), name); err != nil {
		writeError(c, routeError(name, err))
		return
	}
	c.JSON(http.StatusOK, gin.H{"id": name, "object": "route", "deleted": true})
}

// routeError is the answer to a failed change of the route name.
func routeError(name string, err error) *openai.Error {
	var e *openai.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, config.ErrRouteFromFile):
		e := openai.Conflict("route %s is defined in the routes file and is read-only here: edit the file instead", openai.Echo(name))
		e.Code = "route_from_file"
		return e
	case errors.Is(err, config.ErrRouteInvalid):
		return openai.InvalidRequest("", "%v", err)
	case errors.Is(err, store.ErrNotFound):
		return routeNotFound(name)
	}
	return openai.ServerError("route %s: %v", openai.Echo(name), err)
}

// routeNotFound is the 404 for a route that does not exist.
func routeNotFound(name string) *openai.Error {
	e := openai.NotFound("route %s does not exist", openai.Echo(name))
	e.Code = "route_not_found"
	return e
}

// findRoute returns the route called name among rs.
func findRoute(rs config.Routes, name string) (config.Route, bool) {
	i := slices.IndexFunc(rs.Routes, func(r config.Route) bool { return r.Name == name })
	if i < 0 {
		return config.Route{}, false
	}
	return rs.Routes[i], true
}

// routeModels are the routes the caller's key may use, as OpenAI Model
// objects, by name, leaving out names in taken (deployments listed
// already).
func routeModels(ctx context.Context, ra RouteAdmin, taken map[string]bool) []openai.Model {
	p, _ := tenancy.FromContext(ctx)
	var out []openai.Model
	for _, rt := range ra.Routes().Routes {
		if !taken[rt.Name] && p.Allows(rt.Name) {
			out = append(out, routeModel(rt.Name))
		}
	}
	return out
}

// routeModel is a route as an OpenAI Model object.
func routeModel(name string) openai.Model {
	return openai.Model{ID: name, Object: openai.ObjectModel, OwnedBy: "stoke-route"}
}
