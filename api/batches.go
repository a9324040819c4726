package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/batch"
	"github.com/stokehq/stoke/batch/files"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

// Batches is what /v1/batches serves (batch.Service). Each method takes
// the caller's owner (tenancy.Owner) and sees only that owner's batches
// and input files: another owner's is batch.ErrNotFound
// (files.ErrNotFound for Create's input file), as an unknown id is.
type Batches interface {
	// Create records a batch of owner from owner's input file.
	Create(ctx context.Context, owner string, req batch.CreateRequest) (batch.Batch, error)
	// Get returns owner's batch id.
	Get(ctx context.Context, owner, id string) (batch.Batch, error)
	// List returns a page of owner's batches, newest first, after the
	// batch after, and whether more follow.
	List(ctx context.Context, owner, after string, limit int) ([]batch.Batch, bool, error)
	// Cancel cancels owner's batch id.
	Cancel(ctx context.Context, owner, id string) (batch.Batch, error)
}

// Page sizes of GET /v1/batches, as OpenAI's.
const (
	defaultBatchPage = 20
	maxBatchPage     = 100
)

// batchObject is an OpenAI Batch object.
type batchObject struct {
	ID               string          `json:"id"`
	Object           string          `json:"object"`
	Endpoint         string          `json:"endpoint"`
	Errors           *batchErrors    `json:"errors"`
	InputFileID      string          `json:"input_file_id"`
	CompletionWindow string          `json:"completion_window"`
	Status           string          `json:"status"`
	OutputFileID     *string         `json:"output_file_id"`
	ErrorFileID      *string         `json:"error_file_id"`
	CreatedAt        int64           `json:"created_at"`
	InProgressAt     *int64          `json:"in_progress_at"`
	ExpiresAt        *int64          `json:"expires_at"`
	FinalizingAt     *int64          `json:"finalizing_at"`
	CompletedAt      *int64          `json:"completed_at"`
	FailedAt         *int64          `json:"failed_at"`
	ExpiredAt        *int64          `json:"expired_at"`
	CancellingAt     *int64          `json:"cancelling_at"`
	CancelledAt      *int64          `json:"cancelled_at"`
	RequestCounts    requestCounts   `json:"request_counts"`
	Metadata         json.RawMessage `json:"metadata"`
}

type batchErrors struct {
	Object string            `json:"object"`
	Data   []batch.LineError `json:"data"`
}

type requestCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

func toBatchObject(b batch.Batch) batchObject {
	at := func(t time.Time, ok bool) *int64 {
		if !ok {
			return nil
		}
		u := t.Unix()
		return &u
	}
	when := func(s store.BatchStatus) *int64 { t, ok := b.At[s]; return at(t, ok) }
	id := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	out := batchObject{ID: b.ID, Object: "batch", Endpoint: b.Endpoint, InputFileID: b.InputFileID,
		CompletionWindow: b.CompletionWindow, Status: string(b.Status), OutputFileID: id(b.OutputFileID), ErrorFileID: id(b.ErrorFileID),
		CreatedAt: b.CreatedAt.Unix(), ExpiresAt: at(b.ExpiresAt, true),
		InProgressAt: when(store.BatchInProgress), FinalizingAt: when(store.BatchFinalizing), CompletedAt: when(store.BatchCompleted),
		FailedAt: when(store.BatchFailed), ExpiredAt: when(store.BatchExpired), CancellingAt: when(store.BatchCancelling),
		CancelledAt:   when(store.BatchCancelled),
		RequestCounts: requestCounts{Total: b.Total, Completed: b.Completed, Failed: b.Failed}, Metadata: b.Metadata}
	if out.Metadata == nil {
		out.Metadata = json.RawMessage("{}")
	}
	if len(b.Errors) > 0 {
		e := &batchErrors{Object: "list"}
		if json.Unmarshal(b.Errors, &e.Data) == nil {
			out.Errors = e
		}
	}
	return out
}

// mountBatches serves /v1/batches on r from bs, each request as its
// tenant (tenancy.Owner).
func mountBatches(r *gin.Engine, bs Batches, maxBody int64) {
	h := batchesHandler{bs: bs, maxBody: maxBody}
	r.POST("/v1/batches", h.create)
	r.GET("/v1/batches", h.list)
	r.GET("/v1/batches/:id", h.get)
	r.POST("/v1/batches/:id/cancel", h.cancel)
}

type batchesHandler struct {
	bs      Batches
	maxBody int64
}

// batchError turns a batch service error into its OpenAI answer.
func batchError(id string, err error) *openai.Error {
	var inv *batch.InvalidError
	switch {
	case errors.As(err, &inv):
		return openai.InvalidRequest(inv.Param, "%s", inv.Message)
	case errors.Is(err, batch.ErrNotFound):
		return &openai.Error{Status: http.StatusNotFound, Message: "No such Batch object: " + openai.Echo(id),
			Type: openai.TypeInvalidRequest, Param: "id"}
	case errors.Is(err, files.ErrNotFound):
		return &openai.Error{Status: http.StatusNotFound, Message: "No such File object: " + openai.Echo(id),
			Type: openai.TypeInvalidRequest, Param: "input_file_id"}
	case errors.Is(err, batch.ErrNotCancellable):
		return &openai.Error{Status: http.StatusConflict, Message: err.Error(), Type: openai.TypeInvalidRequest, Code: "batch_not_cancellable"}
	}
	return openai.ServerError("%v", err)
}

func (h batchesHandler) create(c *gin.Context) {
	body, e := readBody(c, h.maxBody)
	if e != nil {
		writeError(c, e)
		return
	}
	var req batch.CreateRequest
	if e := openai.Decode(body, &req); e != nil {
		writeError(c, e)
		return
	}
	ctx := c.Request.Context()
	if p, ok := tenancy.FromContext(ctx); ok {
		req.Models = p.Models // the lines may name only what the key may use
	}
	b, err := h.bs.Create(ctx, tenancy.Owner(ctx), req)
	if err != nil {
		writeError(c, batchError(req.InputFileID, err))
		return
	}
	c.JSON(http.StatusOK, toBatchObject(b))
}

func (h batchesHandler) get(c *gin.Context) {
	ctx := c.Request.Context()
	b, err := h.bs.Get(ctx, tenancy.Owner(ctx), c.Param("id"))
	if err != nil {
		writeError(c, batchError(c.Param("id"), err))
		return
	}
	c.JSON(http.StatusOK, toBatchObject(b))
}

// list serves GET /v1/batches with OpenAI's after and limit, newest first.
func (h batchesHandler) list(c *gin.Context) {
	limit := defaultBatchPage
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxBatchPage {
			writeError(c, openai.InvalidRequest("limit", "limit must be an integer from 1 to %d", maxBatchPage))
			return
		}
		limit = n
	}
	after := c.Query("after")
	ctx := c.Request.Context()
	page, more, err := h.bs.List(ctx, tenancy.Owner(ctx), after, limit)
	if errors.Is(err, batch.ErrNotFound) {
		writeError(c, openai.InvalidRequest("after", "after: no batch %s", openai.Echo(after)))
		return
	}
	if err != nil {
		writeError(c, batchError("", err))
		return
	}
	c.JSON(http.StatusOK, newCursorPage(page, more, toBatchObject, func(b batchObject) string { return b.ID }))
}

func (h batchesHandler) cancel(c *gin.Context) {
	ctx := c.Request.Context()
	b, err := h.bs.Cancel(ctx, tenancy.Owner(ctx), c.Param("id"))
	if err != nil {
		writeError(c, batchError(c.Param("id"), err))
		return
	}
	c.JSON(http.StatusOK, toBatchObject(b))
}
