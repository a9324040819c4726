package api

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

// AuthMode says whether requests need keys.
type AuthMode int

const (
	// AuthNone serves everyone (--auth=none).
	AuthNone AuthMode = iota
	// AuthKeys needs a tenant key (or the admin key) on /v1.
	AuthKeys
	// AuthAuto is AuthKeys once an admin key is configured or any tenant
	// key exists, AuthNone before (a loopback `make run`).
	AuthAuto
)

// invalidKey is the 401 OpenAI answers a missing or bad key with.
func invalidKey(msg string) *openai.Error {
	return &openai.Error{Status: http.StatusUnauthorized, Type: openai.TypeInvalidRequest, Code: "invalid_api_key", Message: msg}
}

// bearer is the token of an Authorization: Bearer header ("" if none).
func bearer(c *gin.Context) string {
	h := c.GetHeader("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// authenticate is the auth middleware: /v1 takes a tenant key or the
// admin key (as mode says), /admin the admin key unless adminOpen;
// /health and /metrics are open. The principal goes into the request's
// context for the handlers (and the activator's model scope check).
func authenticate(t *tenancy.Service, mode AuthMode, adminOpen bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		path := c.Request.URL.Path
		v1, admin := strings.HasPrefix(path, "/v1/"), strings.HasPrefix(path, "/admin/")
		switch {
		case v1 && (mode == AuthKeys || mode == AuthAuto && (t.HasAdminKey() || t.HasKeys())):
		case admin && !adminOpen:
		default:
			c.Next()
			return
		}
		token := bearer(c)
		var p tenancy.Principal
		switch {
		case token == "":
			writeError(c, invalidKey("You didn't provide an API key. Send it in an Authorization header: Authorization: Bearer YOUR_KEY."))
			return
		case t.IsAdmin(token):
			p = tenancy.Principal{Admin: true}
		case admin:
			writeError(c, invalidKey("The admin endpoints take the admin key (serve's --admin-key-file or $STOKE_ADMIN_KEY)."))
			return
		default:
			var err error
			if p, err = t.AuthenticateContext(c.Request.Context(), token); err != nil {
				if !errors.Is(err, tenancy.ErrInvalidKey) { // the key store did not answer
					writeError(c, openai.Unavailable("could not check the API key; retry shortly"))
					return
				}
				writeError(c, invalidKey(err.Error()))
				return
			}
		}
		c.Request = c.Request.WithContext(tenancy.WithPrincipal(c.Request.Context(), p))
		c.Next()
	}
}

// tenantObject is a tenant on the admin API.
type tenantObject struct {
	ID        string         `json:"id"`
	Object    string         `json:"object"`
	Name      string         `json:"name"`
	Limits    tenancy.Limits `json:"limits"`
	CreatedAt int64          `json:"created_at"`
}

func toTenantObject(t store.Tenant) tenantObject {
	return tenantObject{ID: t.ID, Object: "tenant", Name: t.Name, Limits: tenancy.LimitsOf(t.Limits), CreatedAt: t.CreatedAt.Unix()}
}

// keyObject is an API key on the admin API; Key is set only in the answer
// that created it.
type keyObject struct {
	ID        string         `json:"id"`
	Object    string         `json:"object"`
	TenantID  string         `json:"tenant_id"`
	Name      string         `json:"name"`
	Hint      string         `json:"hint"`
	Models    []string       `json:"models"`
	Limits    tenancy.Limits `json:"limits"`
	CreatedAt int64          `json:"created_at"`
	ExpiresAt *int64         `json:"expires_at"`
	RevokedAt *int64         `json:"revoked_at"`
	Key       string         `json:"key,omitempty"`
}

func toKeyObject(k store.APIKey) keyObject {
	at := func(t time.Time) *int64 {
		if t.IsZero() {
			return nil
		}
		u := t.Unix()
		return &u
	}
	models := k.Models
	if models == nil {
		models = []string{}
	}
	return keyObject{ID: k.ID, Object: "api_key", TenantID: k.TenantID, Name: k.Name, Hint: k.Hint, Models: models,
		Limits: tenancy.LimitsOf(k.Limits), CreatedAt: k.CreatedAt.Unix(), ExpiresAt: at(k.ExpiresAt), RevokedAt: at(k.RevokedAt)}
}

// mountTenancy serves /admin/tenants and /admin/keys on r.
func mountTenancy(r *gin.Engine, t *tenancy.Service, maxBody int64) {
	h := tenancyHandler{t: t, maxBody: maxBody}
	r.POST("/admin/tenants", h.createTenant)
	r.GET("/admin/tenants", h.listTenants)
	r.DELETE("/admin/tenants/:id", h.deleteTenant)
	r.PUT("/admin/tenants/:id/limits", h.setTenantLimits)
	r.PUT("/admin/keys/:id/limits", h.setKeyLimits)
	r.POST("/admin/keys", h.createKey)
	r.GET("/admin/keys", h.listKeys)
	r.POST("/admin/keys/:id/revoke", h.revokeKey)
}

type tenancyHandler struct {
	t       *tenancy.Service
	maxBody int64
}

// tenancyError turns a tenancy error into its OpenAI answer.
func tenancyError(err error) *openai.Error {
	switch {
	case errors.Is(err, tenancy.ErrNotFound):
		return openai.NotFound("%v", err)
	case errors.Is(err, tenancy.ErrExists):
		return &openai.Error{Status: http.StatusConflict, Type: openai.TypeInvalidRequest, Code: "tenant_exists", Message: err.Error()}
	case errors.Is(err, tenancy.ErrInvalid), errors.Is(err, store.ErrInvalid):
		return openai.InvalidRequest("", "%v", err)
	}
	return openai.ServerError("%v", err)
}

func (h tenancyHandler) createTenant(c *gin.Context) {
	var req struct {
		Name   string         `json:"name"`
		Limits tenancy.Limits `json:"limits"`
	}
	if !h.decode(c, &req) {
		return
	}
	t, err := h.t.CreateTenant(c.Request.Context(), req.Name, req.Limits)
	if err != nil {
		writeError(c, tenancyError(err))
		return
	}
	c.JSON(http.StatusOK, toTenantObject(t))
}

// setTenantLimits serves PUT /admin/tenants/{id}/limits: the body is the
// limits (absent fields are no limit).
func (h tenancyHandler) setTenantLimits(c *gin.Context) {
	var l tenancy.Limits
	if !h.decode(c, &l) {
		return
	}
	t, err := h.t.SetTenantLimits(c.Request.Context(), c.Param("id"), l)
	if err != nil {
		writeError(c, tenancyError(err))
		return
	}
	c.JSON(http.StatusOK, toTenantObject(t))
}

// setKeyLimits serves PUT /admin/keys/{id}/limits.
func (h tenancyHandler) setKeyLimits(c *gin.Context) {
	var l tenancy.Limits
	if !h.decode(c, &l) {
		return
	}
	k, err := h.t.SetKeyLimits(c.Request.Context(), c.Param("id"), l)
	if err != nil {
		writeError(c, tenancyError(err))
		return
	}
	c.JSON(http.StatusOK, toKeyObject(k))
}

func (h tenancyHandler) listTenants(c *gin.Context) {
	ts, err := h.t.Tenants(c.Request.Context())
	if err != nil {
		writeError(c, tenancyError(err))
		return
	}
	out := struct {
		Object string         `json:"object"`
		Data   []tenantObject `json:"data"`
	}{Object: "list", Data: []tenantObject{}}
	for _, t := range ts {
		out.Data = append(out.Data, toTenantObject(t))
	}
	c.JSON(http.StatusOK, out)
}

func (h tenancyHandler) deleteTenant(c *gin.Context) {
	if err := h.t.DeleteTenant(c.Request.Context(), c.Param("id")); err != nil {
		writeError(c, tenancyError(err))
		return
	}
	c.JSON(http.StatusOK, gin.H{"id": c.Param("id"), "object": "tenant", "deleted": true})
}

func (h tenancyHandler) createKey(c *gin.Context) {
	var req tenancy.KeyRequest
	if !h.decode(c, &req) {
		return
	}
	k, key, err := h.t.CreateKey(c.Request.Context(), req)
	if err != nil {
		writeError(c, tenancyError(err))
		return
	}
	out := toKeyObject(k)
	out.Key = key
	c.JSON(http.StatusOK, out)
}

func (h tenancyHandler) listKeys(c *gin.Context) {
	keys, err := h.t.Keys(c.Request.Context(), c.Query("tenant"))
	if err != nil {
		writeError(c, tenancyError(err))
		return
	}
	out := struct {
		Object string      `json:"object"`
		Data   []keyObject `json:"data"`
	}{Object: "list", Data: []keyObject{}}
	for _, k := range keys {
		out.Data = append(out.Data, toKeyObject(k))
	}
	c.JSON(http.StatusOK, out)
}

func (h tenancyHandler) revokeKey(c *gin.Context) {
	k, err := h.t.RevokeKey(c.Request.Context(), c.Param("id"))
	if err != nil {
		writeError(c, tenancyError(err))
		return
	}
	c.JSON(http.StatusOK, toKeyObject(k))
}

// decode reads a JSON body into v, answering the error itself.
func (h tenancyHandler) decode(c *gin.Context, v any) bool {
	body, e := readBody(c, h.maxBody)
	if e == nil {
		e = openai.Decode(body, v)
	}
	if e != nil {
		writeError(c, e)
		return false
	}
	return true
}
