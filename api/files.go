package api

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/batch/files"
	"github.com/stokehq/stoke/internal/openai"
)

// formSlack is what a multipart upload may carry besides the file's
// content (boundaries, part headers, the purpose field).
const formSlack = 1 << 20

// maxListLimit is the largest page of GET /v1/files, as OpenAI's (and its
// default).
const maxListLimit = 10_000

// fileObject is an OpenAI File object.
type fileObject struct {
	ID            string  `json:"id"`
	Object        string  `json:"object"`
	Bytes         int64   `json:"bytes"`
	CreatedAt     int64   `json:"created_at"`
	Filename      string  `json:"filename"`
	Purpose       string  `json:"purpose"`
	Status        string  `json:"status"`
	ExpiresAt     *int64  `json:"expires_at"`
	StatusDetails *string `json:"status_details"`
}

func toFileObject(f files.File) fileObject {
	return fileObject{ID: f.ID, Object: "file", Bytes: f.Bytes, CreatedAt: f.CreatedAt.Unix(), Filename: f.Filename,
		Purpose: f.Purpose, Status: "processed"}
}

// mountFiles serves /v1/files on r from fs. Each request sees only the
// files of its tenant (tenancy.Owner): another tenant's file is answered
// as an unknown one.
func mountFiles(r *gin.Engine, fs *files.Store) {
	h := filesHandler{fs}
	r.POST("/v1/files", h.upload)
	r.GET("/v1/files", h.list)
	r.GET("/v1/files/:id", h.get)
	r.GET("/v1/files/:id/content", h.content)
	r.DELETE("/v1/files/:id", h.delete)
}

type filesHandler struct{ fs *files.Store }

// fileError turns a files store error into its OpenAI answer.
func fileError(id string, err error) *openai.Error {
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, files.ErrNotFound):
		return &openai.Error{Status: http.StatusNotFound, Message: "No such File object: " + openai.Echo(id),
			Type: openai.TypeInvalidRequest, Param: "id"}
	case errors.Is(err, files.ErrTooLarge), errors.As(err, &tooBig):
		e := &openai.Error{Status: http.StatusRequestEntityTooLarge, Message: err.Error(), Type: openai.TypeInvalidRequest,
			Param: "file", Code: "file_too_large"}
		if tooBig != nil {
			e.Message = "the upload exceeds the limit of " + strconv.FormatInt(tooBig.Limit-formSlack, 10) + " bytes"
		}
		return e
	case errors.Is(err, files.ErrTooManyLines):
		e := openai.InvalidRequest("file", "%v", err)
		e.Code = "too_many_lines"
		return e
	case errors.Is(err, files.ErrPurpose):
		return openai.InvalidRequest("purpose", "%v", err)
	case errors.Is(err, files.ErrBadFile):
		return openai.InvalidRequest("file", "%v", err)
	}
	return openai.ServerError("%v", err)
}

// uploadReadTimeout is how long a file upload may take to arrive: 200 MB
// at 250 kB/s, a slow client's link.
const uploadReadTimeout = 15 * time.Minute

// upload serves POST /v1/files: a multipart form with the parts "file"
// and "purpose", in either order. The file streams into the store; a
// purpose sent first is checked before any of it is read.
func (h filesHandler) upload(c *gin.Context) {
	limit := h.fs.MaxBytes() + formSlack
	if c.Request.ContentLength > limit {
		writeError(c, fileError("", &http.MaxBytesError{Limit: limit}))
		return
	}
	if mt, _, err := mime.ParseMediaType(c.GetHeader("Content-Type")); err != nil || mt != "multipart/form-data" {
		writeError(c, openai.InvalidRequest("file", "POST /v1/files takes a multipart/form-data body with the parts file and purpose"))
		return
	}
	// A file may be 200 MB: it gets uploadReadTimeout to arrive rather than
	// the server's read timeout, which is sized for requests.
	http.NewResponseController(c.Writer).SetReadDeadline(time.Now().Add(uploadReadTimeout))
	c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, limit)
	mr, err := c.Request.MultipartReader()
	if err != nil {
		writeError(c, openai.InvalidRequest("file", "read multipart form: %v", err))
		return
	}
	ctx := c.Request.Context()
	var (
		up         *files.Upload
		purpose    string
		hasPurpose bool
	)
	fail := func(e *openai.Error) {
		if up != nil {
			up.Abort(ctx)
		}
		writeError(c, e)
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if e := fileError("", err); e.Status == http.StatusRequestEntityTooLarge {
				fail(e)
			} else {
				fail(openai.InvalidRequest("file", "read multipart form: %v", err))
			}
			return
		}
		switch part.FormName() {
		case "purpose":
			b, err := io.ReadAll(io.LimitReader(part, 257))
			if err != nil || len(b) > 256 {
				fail(openai.InvalidRequest("purpose", "purpose must be a short string"))
				return
			}
			purpose, hasPurpose = string(b), true
			if err := files.CheckPurpose(purpose); err != nil {
				fail(fileError("", err))
				return
			}
		case "file":
			if up != nil {
				fail(openai.InvalidRequest("file", "send one file part only"))
				return
			}
			if up, err = h.fs.Stage(ctx, tenancy.Owner(ctx), part.FileName(), part); err != nil {
				fail(fileError("", err))
				return
			}
		default: // other fields (expires_after, ...) are not used
			if _, err := io.Copy(io.Discard, part); err != nil {
				fail(fileError("", err))
				return
			}
		}
	}
	switch {
	case up == nil:
		fail(openai.InvalidRequest("file", "missing required parameter: file (a multipart part named file)"))
		return
	case !hasPurpose:
		fail(openai.InvalidRequest("purpose", "missing required parameter: purpose"))
		return
	}
	f, err := up.Commit(ctx, purpose)
	if err != nil {
		writeError(c, fileError("", err))
		return
	}
	c.JSON(http.StatusOK, toFileObject(f))
}

// list serves GET /v1/files with OpenAI's purpose, limit, after and order.
func (h filesHandler) list(c *gin.Context) {
	o := files.ListOptions{Purpose: c.Query("purpose"), After: c.Query("after"), Limit: maxListLimit}
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(c, openai.InvalidRequest("limit", "limit must be an integer from 1 to %d", maxListLimit))
			return
		}
		o.Limit = n
	}
	switch c.Query("order") {
	case "", "desc":
	case "asc":
		o.Asc = true
	default:
		writeError(c, openai.InvalidRequest("order", "order must be asc or desc"))
		return
	}
	ctx := c.Request.Context()
	page, more, err := h.fs.List(ctx, tenancy.Owner(ctx), o)
	if errors.Is(err, files.ErrNotFound) {
		writeError(c, openai.InvalidRequest("after", "after: no file %s", openai.Echo(o.After)))
		return
	}
	if err != nil {
		writeError(c, fileError("", err))
		return
	}
	c.JSON(http.StatusOK, newCursorPage(page, more, toFileObject, func(f fileObject) string { return f.ID }))
}

// cursorPage is a page of an OpenAI list with cursor pagination (after=ID).
type cursorPage[T any] struct {
	Object  string  `json:"object"`
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

// newCursorPage is the page of items, each shown as object, whose ids
// give the page's first and last.
func newCursorPage[R, T any](items []R, more bool, object func(R) T, id func(T) string) cursorPage[T] {
	out := cursorPage[T]{Object: "list", Data: make([]T, 0, len(items)), HasMore: more}
	for _, it := range items {
		out.Data = append(out.Data, object(it))
	}
	if n := len(out.Data); n > 0 {
		first, last := id(out.Data[0]), id(out.Data[n-1])
		out.FirstID, out.LastID = &first, &last
	}
	return out
}

func (h filesHandler) get(c *gin.Context) {
	ctx := c.Request.Context()
	f, err := h.fs.Get(ctx, tenancy.Owner(ctx), c.Param("id"))
	if err != nil {
		writeError(c, fileError(c.Param("id"), err))
		return
	}
	c.JSON(http.StatusOK, toFileObject(f))
}

// content serves GET /v1/files/{id}/content: the bytes as uploaded.
func (h filesHandler) content(c *gin.Context) {
	ctx := c.Request.Context()
	f, rc, err := h.fs.Open(ctx, tenancy.Owner(ctx), c.Param("id"))
	if err != nil {
		writeError(c, fileError(c.Param("id"), err))
		return
	}
	defer rc.Close()
	c.Header("Content-Length", strconv.FormatInt(f.Bytes, 10))
	c.Header("Content-Type", "application/octet-stream")
	c.Status(http.StatusOK)
	// Once the first byte is out a failure can only cut the body short,
	// which the client sees against Content-Length.
	io.Copy(c.Writer, rc)
}

func (h filesHandler) delete(c *gin.Context) {
	ctx := c.Request.Context()
	f, err := h.fs.Delete(ctx, tenancy.Owner(ctx), c.Param("id"))
	if err != nil && f.ID == "" {
		writeError(c, fileError(c.Param("id"), err))
		return
	}
	// A row forgotten but content left behind is still deleted for the
	// client; Sweep removes the content later.
	c.JSON(http.StatusOK, gin.H{"id": c.Param("id"), "object": "file", "deleted": true})
}
