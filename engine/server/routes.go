package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/openai"
)

// routes builds the gin router.
func (s *Server) routes() http.Handler {
	if gin.Mode() == gin.DebugMode {
		gin.SetMode(gin.ReleaseMode) // no route dumps or debug warnings
	}
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(s.logRequests, gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, v any) {
		s.log.Error("handler panicked", "path", c.Request.URL.Path, "panic", v)
		writeError(c, openai.ServerError("internal error"))
	}))
	r.NoRoute(func(c *gin.Context) {
		writeError(c, openai.RouteNotFound(c.Request.Method, c.Request.URL.Path))
	})
	// gin has set the Allow header by the time NoMethod runs.
	r.NoMethod(func(c *gin.Context) {
		writeError(c, openai.MethodNotAllowed(c.Request.Method, c.Request.URL.Path, c.Writer.Header().Get("Allow")))
	})

	r.GET("/health", s.health)
	r.GET("/v1/models", s.models)
	// A catch-all, as model names may hold slashes ("org/name").
	r.GET("/v1/models/*id", s.retrieveModel)
	r.POST("/v1/completions", s.completions)
	r.POST("/v1/chat/completions", s.chatCompletions)
	r.POST("/tokenize", s.tokenize)
	r.POST("/detokenize", s.detokenize)
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	r.GET("/metrics", gin.WrapH(metrics))

	r.GET("/admin/state", func(c *gin.Context) { writeJSON(c, http.StatusOK, s.Info()) })
	r.POST("/admin/load", s.adminLoad)
	r.POST("/admin/sleep", s.adminOp(s.Sleep))
	r.POST("/admin/wake", s.adminOp(s.Wake))
	r.POST("/admin/unload", s.adminOp(s.Unload))
	s.adapterRoutes(r)
	return r
}

// logRequests logs every request at debug level, server errors as warnings.
func (s *Server) logRequests(c *gin.Context) {
	start := time.Now()
	c.Next()
	status := c.Writer.Status()
	level := slog.LevelDebug
	if status >= 500 && status != http.StatusServiceUnavailable {
		level = slog.LevelWarn
	}
	s.log.Log(c.Request.Context(), level, "request", "method", c.Request.Method, "path", c.Request.URL.Path,
		"status", status, "duration", time.Since(start))
}

// writeJSON writes v without HTML escaping, so special tokens stay readable.
func writeJSON(c *gin.Context, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":{"message":"encode response","type":"server_error","param":null,"code":null}}`)
	}
	c.Data(status, "application/json", buf.Bytes())
}

func writeError(c *gin.Context, e *openai.Error) {
	writeJSON(c, e.Status, e.Body())
}

// apiError turns any error into an *openai.Error, 500 unless it is one.
func apiError(err error, format string) *openai.Error {
	var e *openai.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, fs.ErrNotExist) {
		return openai.NotFound(format, err)
	}
	return openai.ServerError(format, err)
}

// readBody reads a request body of at most MaxBodyBytes.
func (s *Server) readBody(c *gin.Context) ([]byte, *openai.Error) {
	limit := s.opts.MaxBodyBytes
	if c.Request.ContentLength > limit {
		return nil, openai.BodyTooLarge(limit)
	}
	b, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, openai.BodyTooLarge(limit)
		}
		return nil, openai.InvalidRequest("", "read request body: %v", err)
	}
	return b, nil
}

// decodeBody reads and parses a JSON body into v.
func (s *Server) decodeBody(c *gin.Context, v any) *openai.Error {
	b, e := s.readBody(c)
	if e != nil {
		return e
	}
	return openai.Decode(b, v)
}

func (s *Server) health(c *gin.Context) {
	s.mu.Lock()
	st := s.state
	s.mu.Unlock()
	if st != engineapi.StateReady {
		writeError(c, openai.Unavailable("the engine is %s, not ready", st))
		return
	}
	c.Status(http.StatusOK)
}

func (s *Server) models(c *gin.Context) {
	l, _, e := s.acquire()
	if e != nil {
		writeError(c, e)
		return
	}
	defer s.release()
	writeJSON(c, http.StatusOK, openai.ModelList{Object: openai.ObjectList, Data: append([]openai.Model{modelObject(l)}, adapterModels(l)...)})
}

// retrieveModel serves GET /v1/models/{id}: the loaded model when id names it
// (an empty id lists the models, as /v1/models does).
func (s *Server) retrieveModel(c *gin.Context) {
	id := strings.TrimPrefix(c.Param("id"), "/")
	if id == "" {
		s.models(c)
		return
	}
	l, _, e := s.acquire()
	if e != nil {
		writeError(c, e)
		return
	}
	defer s.release()
	if id != l.Name {
		if m, ok := adapterModel(l, id); ok {
			writeJSON(c, http.StatusOK, m)
			return
		}
		writeError(c, openai.ModelNotFound(id))
		return
	}
	writeJSON(c, http.StatusOK, modelObject(l))
}

// modelObject is the loaded model as an OpenAI Model object.
func modelObject(l *Loaded) openai.Model {
	return openai.Model{ID: l.Name, Object: openai.ObjectModel, Created: time.Now().Unix(), OwnedBy: "stoke", MaxModelLen: l.MaxModelLen}
}

func (s *Server) adminLoad(c *gin.Context) {
	var req engineapi.LoadRequest
	if e := s.decodeBody(c, &req); e != nil {
		writeError(c, e)
		return
	}
	switch {
	case req.Path != "" && (req.Source != "" || req.Model != "" || req.Revision != ""):
		writeError(c, openai.InvalidRequest("path", "give either path (a directory on this node) or source and model (a bucket), not both"))
		return
	case req.Path == "" && req.Source == "":
		writeError(c, openai.InvalidRequest("source", "source is required: the bucket (s3://… or file://…) holding the model, or path: a model directory on this node"))
		return
	case req.Path == "" && req.Model == "":
		writeError(c, openai.InvalidRequest("model", "model is required: the model's name, its prefix in the bucket"))
		return
	}
	if err := s.Load(c.Request.Context(), req); err != nil {
		writeError(c, apiError(err, "%v"))
		return
	}
	writeJSON(c, http.StatusOK, s.Info())
}

// adminOp serves an operation that takes no body.
func (s *Server) adminOp(op func(context.Context) error) gin.HandlerFunc {
	return func(c *gin.Context) {
		if err := op(c.Request.Context()); err != nil {
			writeError(c, apiError(err, "%v"))
			return
		}
		writeJSON(c, http.StatusOK, s.Info())
	}
}
