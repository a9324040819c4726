package api

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

// usageSource is what the usage endpoints read: the usage records' totals
// and the tenants (for their names). *tenancy.Service is one.
type usageSource interface {
	UsageTotals(ctx context.Context, q store.UsageQuery) ([]store.UsageTotal, error)
	Tenants(ctx context.Context) ([]store.Tenant, error)
}

// usageObject is the total of one tenant, model and UTC day on
// /admin/usage and /v1/usage.
type usageObject struct {
	TenantID string `json:"tenant_id"`
	// Tenant is the tenant's name ("" for no tenant, or one deleted since).
	Tenant           string `json:"tenant"`
	Model            string `json:"model"`
	Day              string `json:"day"`
	Requests         int    `json:"requests"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	CachedTokens     int64  `json:"cached_tokens"`
}

// usageCSVHeader is the header row of a CSV answer: the JSON fields, in
// their order.
var usageCSVHeader = []string{"tenant_id", "tenant", "model", "day", "requests", "prompt_tokens", "completion_tokens", "cached_tokens"}

// usageDay is the layout of the since and until parameters.
const usageDay = "2006-01-02"

// mountUsage serves GET /admin/usage (every tenant's totals, for the
// operator) and GET /v1/usage (the caller's own tenant's) on r.
func mountUsage(r *gin.Engine, src usageSource) {
	h := usageHandler{src: src}
	r.GET("/admin/usage", h.admin)
	r.GET("/v1/usage", h.own)
}

type usageHandler struct {
	src usageSource
}

// usageRequest is a parsed usage query: what to sum and how to answer.
type usageRequest struct {
	q   store.UsageQuery
	csv bool
}

// parseUsage reads the query parameters both endpoints share: model,
// since and until (UTC days, both included) and format (json or csv).
func parseUsage(c *gin.Context) (usageRequest, *openai.Error) {
	var req usageRequest
	req.q.Model = c.Query("model")
	var since, until time.Time
	for _, p := range []struct {
		name string
		to   *time.Time
	}{{"since", &since}, {"until", &until}} {
		v := c.Query(p.name)
		if v == "" {
			continue
		}
		d, err := time.ParseInLocation(usageDay, v, time.UTC)
		if err != nil {
			return req, openai.InvalidRequest(p.name, "%s must be a day as YYYY-MM-DD (UTC), not %q", p.name, openai.Echo(v))
		}
		*p.to = d
	}
	if !since.IsZero() && !until.IsZero() && until.Before(since) {
		return req, openai.InvalidRequest("until", "until %s is before since %s", until.Format(usageDay), since.Format(usageDay))
	}
	req.q.Since = since
	if !until.IsZero() {
		req.q.Until = until.AddDate(0, 0, 1) // the day included
	}
	switch f := c.Query("format"); f {
	case "", "json":
	case "csv":
		req.csv = true
	default:
		return req, openai.InvalidRequest("format", "format must be json or csv, not %q", openai.Echo(f))
	}
	return req, nil
}

// admin serves GET /admin/usage: the totals of every tenant (of one with
// tenant=, its id or name), per model and UTC day. The auth middleware
// lets only the admin key (or nobody's, with /admin open) through; a
// tenant's principal that reached it all the same is refused.
func (h usageHandler) admin(c *gin.Context) {
	if p, ok := tenancy.FromContext(c.Request.Context()); ok && !p.Admin {
		writeError(c, invalidKey("The admin endpoints take the admin key (serve's --admin-key-file or $STOKE_ADMIN_KEY)."))
		return
	}
	req, e := parseUsage(c)
	if e != nil {
		writeError(c, e)
		return
	}
	names, e := h.tenantNames(c.Request.Context())
	if e != nil {
		writeError(c, e)
		return
	}
	if t := c.Query("tenant"); t != "" {
		req.q.Tenant = t
		if _, isID := names[t]; !isID {
			// A name stands for its tenant's id; a value that is neither
			// is still an id (a deleted tenant's records remain).
			for id, name := range names {
				if name == t {
					req.q.Tenant = id
					break
				}
			}
		}
	}
	h.answer(c, req, names, nil)
}

// own serves GET /v1/usage: the caller's own tenant's totals, and never
// another's (tenant= is refused). A request with no tenant (auth off, or
// the admin key) sees the records of no tenant only. A key scoped to
// models sees those models' totals only, as /v1/models lists only them.
func (h usageHandler) own(c *gin.Context) {
	if _, ok := c.GetQuery("tenant"); ok {
		writeError(c, openai.InvalidRequest("tenant", "tenant is not a parameter of /v1/usage: it answers your own tenant's usage only"))
		return
	}
	req, e := parseUsage(c)
	if e != nil {
		writeError(c, e)
		return
	}
	p, _ := tenancy.FromContext(c.Request.Context())
	req.q.Tenant, req.q.ExactTenant = p.TenantID, true
	names, e := h.tenantNames(c.Request.Context())
	if e != nil {
		writeError(c, e)
		return
	}
	h.answer(c, req, names, p.Allows)
}

// tenantNames maps every tenant's id to its name.
func (h usageHandler) tenantNames(ctx context.Context) (map[string]string, *openai.Error) {
	ts, err := h.src.Tenants(ctx)
	if err != nil {
		return nil, openai.ServerError("read usage: %v", err)
	}
	names := make(map[string]string, len(ts))
	for _, t := range ts {
		names[t.ID] = t.Name
	}
	return names, nil
}

// answer sums what req selects and answers it as JSON or CSV; allows,
// when not nil, keeps only the models it allows.
func (h usageHandler) answer(c *gin.Context, req usageRequest, names map[string]string, allows func(model string) bool) {
	totals, err := h.src.UsageTotals(c.Request.Context(), req.q)
	if err != nil {
		writeError(c, openai.ServerError("read usage: %v", err))
		return
	}
	data := make([]usageObject, 0, len(totals))
	for _, u := range totals {
		if allows != nil && !allows(u.Model) {
			continue
		}
		data = append(data, usageObject{TenantID: u.TenantID, Tenant: names[u.TenantID], Model: u.Model, Day: u.Day, Requests: u.Requests,
			PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, CachedTokens: u.CachedTokens})
	}
	if !req.csv {
		c.JSON(http.StatusOK, struct {
			Object string        `json:"object"`
			Data   []usageObject `json:"data"`
		}{Object: "list", Data: data})
		return
	}
	body, err := usageCSV(data)
	if err != nil {
		writeError(c, openai.ServerError("write usage: %v", err))
		return
	}
	c.Data(http.StatusOK, "text/csv; charset=utf-8", body)
}

// usageCSV is data as CSV: usageCSVHeader, then a row per total.
func usageCSV(data []usageObject) ([]byte, error) {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	if err := w.Write(usageCSVHeader); err != nil {
		return nil, fmt.Errorf("usage csv: %w", err)
	}
	for _, u := range data {
		row := []string{u.TenantID, u.Tenant, u.Model, u.Day, strconv.Itoa(u.Requests), strconv.FormatInt(u.PromptTokens, 10),
			strconv.FormatInt(u.CompletionTokens, 10), strconv.FormatInt(u.CachedTokens, 10)}
		if err := w.Write(row); err != nil {
			return nil, fmt.Errorf("usage csv: %w", err)
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return nil, fmt.Errorf("usage csv: %w", err)
	}
	return buf.Bytes(), nil
}
