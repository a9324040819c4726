package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/scaler/reconcile"
)

// mountRollouts mounts a deployment's rollout surface: its rollouts'
// history, and promote, roll back, pin and unpin by hand.
func mountRollouts(r *gin.Engine, o Options) {
	r.GET("/admin/deployments/:name/rollouts", o.listRollouts)
	r.POST("/admin/deployments/:name/promote", o.endCanary(Deployments.Promote))
	r.POST("/admin/deployments/:name/rollback", o.endCanary(Deployments.Rollback))
	r.POST("/admin/deployments/:name/pin", o.pin)
	r.POST("/admin/deployments/:name/unpin", o.unpin)
}

// rolloutJSON is a rollout as the admin API shows it.
type rolloutJSON struct {
	ID            int64              `json:"id"`
	Stable        string             `json:"stable"`
	Candidate     string             `json:"candidate"`
	CanaryPercent int                `json:"canary_percent"`
	State         store.RolloutState `json:"state"`
	Reason        string             `json:"reason,omitempty"`
	// Eval is the eval gate's verdict with its figures, once it ran.
	Eval      json.RawMessage `json:"eval,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

func toRolloutJSON(r store.Rollout) rolloutJSON {
	return rolloutJSON{ID: r.ID, Stable: r.Stable, Candidate: r.Candidate, CanaryPercent: r.CanaryPercent, State: r.State,
		Reason: r.Reason, Eval: r.Eval, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
}

func (o Options) listRollouts(c *gin.Context) {
	name := c.Param("name")
	if _, err := o.Deployments.Deployment(c.Request.Context(), name); err != nil {
		writeError(c, deploymentError(name, err))
		return
	}
	rs, err := o.Deployments.Rollouts(c.Request.Context(), name)
	if err != nil {
		writeError(c, openai.ServerError("list rollouts: %v", err))
		return
	}
	out := struct {
		Object string        `json:"object"`
		Data   []rolloutJSON `json:"data"`
	}{Object: "list", Data: []rolloutJSON{}}
	for _, r := range rs {
		out.Data = append(out.Data, toRolloutJSON(r))
	}
	c.JSON(http.StatusOK, out)
}

// endCanary answers POST …/promote and …/rollback with the rollout as it
// ended; 409 when no canary runs. end is a method expression of
// Deployments, applied when a request comes, so mounting needs none.
func (o Options) endCanary(end func(d Deployments, ctx context.Context, name string) (store.Rollout, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		name := c.Param("name")
		if _, err := o.Deployments.Deployment(c.Request.Context(), name); err != nil {
			writeError(c, deploymentError(name, err))
			return
		}
		r, err := end(o.Deployments, c.Request.Context(), name)
		switch {
		case errors.Is(err, reconcile.ErrNoCanary), errors.Is(err, store.ErrIllegalTransition):
			writeError(c, &openai.Error{Status: http.StatusConflict, Type: openai.TypeInvalidRequest, Code: "no_canary",
				Message: "deployment " + name + " has no canary in progress"})
			return
		case err != nil:
			writeError(c, deploymentError(name, err))
			return
		}
		c.JSON(http.StatusOK, toRolloutJSON(r))
	}
}

func (o Options) pin(c *gin.Context) {
	body, e := o.readBody(c)
	if e != nil {
		writeError(c, e)
		return
	}
	var req struct {
		Revision string `json:"revision"`
	}
	if e := openai.Decode(body, &req); e != nil {
		writeError(c, e)
		return
	}
	if req.Revision == "" {
		writeError(c, openai.InvalidRequest("revision", "revision is required (a digest, as sha256:…)"))
		return
	}
	d, err := o.Deployments.Pin(c.Request.Context(), c.Param("name"), req.Revision)
	if err != nil {
		writeError(c, deploymentError(c.Param("name"), err))
		return
	}
	c.JSON(http.StatusOK, o.toJSON(c.Request.Context(), d))
}

func (o Options) unpin(c *gin.Context) {
	d, err := o.Deployments.Unpin(c.Request.Context(), c.Param("name"))
	if err != nil {
		writeError(c, deploymentError(c.Param("name"), err))
		return
	}
	c.JSON(http.StatusOK, o.toJSON(c.Request.Context(), d))
}
