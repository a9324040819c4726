package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/openai"
)

// LoRAOptions turn on multi-LoRA serving, as vLLM's --enable-lora,
// --max-loras, --max-lora-rank and --lora-modules do.
type LoRAOptions struct {
	Enabled bool
	// MaxLoras is the number of adapter slots: how many adapters hold
	// their weights, and so can share a batch, at once; 0 means
	// core.DefaultMaxLoras.
	MaxLoras int
	// MaxRank bounds an adapter's r; 0 means core.DefaultMaxLoRARank.
	MaxRank int
	// Modules are registered when a model loads (--lora-modules: the
	// pool's Preload, which Server.Load calls); a bad one fails the load.
	Modules []core.AdapterSpec
}

// WithDefaults fills in the zero sizes.
func (o LoRAOptions) WithDefaults() LoRAOptions {
	if o.MaxLoras == 0 {
		o.MaxLoras = core.DefaultMaxLoras
	}
	if o.MaxRank == 0 {
		o.MaxRank = core.DefaultMaxLoRARank
	}
	return o
}

// AdapterPool returns the adapter pool of a model loaded with o, whose
// adapters load reads; nil (and no error) when LoRA is off.
func (o EngineOptions) AdapterPool(load core.AdapterLoadFunc) (*core.AdapterPool, error) {
	l := o.LoRA.WithDefaults()
	if !l.Enabled {
		return nil, nil
	}
	p, err := core.NewAdapterPool(core.AdapterPoolConfig{Slots: l.MaxLoras, MaxRank: l.MaxRank, Load: load, Preload: l.Modules})
	if err != nil {
		return nil, fmt.Errorf("enable LoRA: %w", err)
	}
	return p, nil
}

// ParseLoRAModules reads --lora-modules values, each "name=path" or vLLM's
// JSON form {"name": …, "path": …} (with "revision" for a bucket adapter;
// "base_model_name" is accepted and ignored).
func ParseLoRAModules(values []string) ([]core.AdapterSpec, error) {
	var out []core.AdapterSpec
	seen := map[string]bool{}
	for _, v := range values {
		v = strings.TrimSpace(v)
		var spec core.AdapterSpec
		if strings.HasPrefix(v, "{") {
			var j struct {
				Name          string `json:"name"`
				Path          string `json:"path"`
				Revision      string `json:"revision"`
				BaseModelName string `json:"base_model_name"`
			}
			if err := json.Unmarshal([]byte(v), &j); err != nil {
				return nil, fmt.Errorf("--lora-modules %s: %w", v, err)
			}
			spec = core.AdapterSpec{Name: j.Name, Path: j.Path, Revision: j.Revision}
		} else {
			name, path, ok := strings.Cut(v, "=")
			if !ok {
				return nil, fmt.Errorf("--lora-modules %q: want name=path or a JSON object", v)
			}
			spec = core.AdapterSpec{Name: name, Path: path}
		}
		if err := core.CheckAdapterName(spec.Name); err != nil {
			return nil, fmt.Errorf("--lora-modules %q: %w", v, err)
		}
		if spec.Path == "" {
			return nil, fmt.Errorf("--lora-modules %q: the path is empty", v)
		}
		if seen[spec.Name] {
			return nil, fmt.Errorf("--lora-modules: adapter %s is given twice", spec.Name)
		}
		seen[spec.Name] = true
		out = append(out, spec)
	}
	return out, nil
}

// isBucketPath reports whether an adapter path names a bucket prefix
// rather than a directory on this node.
func isBucketPath(path string) bool {
	return strings.HasPrefix(path, "s3://") || strings.HasPrefix(path, "file://")
}

// simAdapterLoader reads only an adapter's adapter_config.json: the sim
// computes nothing, so it serves an adapter as its base. It reads no
// bucket either (as it serves any bucket model from its profile), so a
// bucket adapter is taken as named, with rank 1.
func simAdapterLoader(maxRank int) core.AdapterLoadFunc {
	return func(ctx context.Context, spec core.AdapterSpec) (*model.Adapter, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if isBucketPath(spec.Path) {
			return model.AdapterFromConfig(model.AdapterConfig{R: 1, LoraAlpha: 1, TargetModules: model.TargetModules{AllLinear: true}}, maxRank)
		}
		if _, err := os.Stat(spec.Path); err != nil {
			return nil, fmt.Errorf("open LoRA adapter %s: %w", spec.Path, err)
		}
		raw, err := os.ReadFile(filepath.Join(spec.Path, model.AdapterConfigFile))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("open LoRA adapter %s: %w: %s is missing", spec.Path, model.ErrInvalidAdapter, model.AdapterConfigFile)
		}
		if err != nil {
			return nil, fmt.Errorf("open LoRA adapter %s: %w", spec.Path, err)
		}
		cfg, err := model.ParseAdapterConfig(raw, maxRank)
		if err != nil {
			return nil, fmt.Errorf("open LoRA adapter %s: %w", spec.Path, err)
		}
		return model.AdapterFromConfig(cfg, maxRank)
	}
}

// preloadAdapters registers the adapters a freshly loaded model was given
// (--lora-modules).
func preloadAdapters(ctx context.Context, l *Loaded) error {
	if l.Adapters == nil {
		return nil
	}
	if err := l.Adapters.Preload(ctx); err != nil {
		return fmt.Errorf("--lora-modules: %w", err)
	}
	return nil
}

// requestAdapter resolves the model a request names: the base ("" or its
// name) is adapter "", "BASE:ADAPTER" or "ADAPTER" a registered adapter;
// ok is false for any other name.
func (l *Loaded) requestAdapter(name string) (adapter string, ok bool) {
	if name == "" || name == l.Name {
		return "", true
	}
	if l.Adapters == nil {
		return "", false
	}
	if base, a, split := engineapi.SplitAdapterModel(name); split && base == l.Name && l.Adapters.Has(a) {
		return a, true
	}
	if l.Adapters.Has(name) {
		return name, true
	}
	return "", false
}

// adapterOf is the adapter a request's model names ("" for the base).
func adapterOf(l *Loaded, name string) string {
	a, _ := l.requestAdapter(name)
	return a
}

// as makes responses name the model as the request did when it named an
// adapter, as vLLM answers with the LoRA's name.
func (h head) as(l *Loaded, name string) head {
	if adapterOf(l, name) != "" {
		h.model = name
	}
	return h
}

// adapterModels lists the registered adapters as models of their own:
// id BASE:ADAPTER, parent the base, as vLLM lists LoRA modules.
func adapterModels(l *Loaded) []openai.Model {
	if l.Adapters == nil {
		return nil
	}
	var out []openai.Model
	now := time.Now().Unix()
	for _, name := range l.Adapters.Names() {
		out = append(out, openai.Model{ID: engineapi.AdapterModel(l.Name, name), Object: openai.ObjectModel, Created: now,
			OwnedBy: "stoke", MaxModelLen: l.MaxModelLen, Parent: l.Name})
	}
	return out
}

// adapterModel is the model object of the adapter id names
// ("BASE:ADAPTER" or "ADAPTER").
func adapterModel(l *Loaded, id string) (openai.Model, bool) {
	a := adapterOf(l, id)
	if a == "" {
		return openai.Model{}, false
	}
	return openai.Model{ID: engineapi.AdapterModel(l.Name, a), Object: openai.ObjectModel, Created: time.Now().Unix(),
		OwnedBy: "stoke", MaxModelLen: l.MaxModelLen, Parent: l.Name}, true
}

// adapterRoutes serves the adapter endpoints: stoke's /admin/adapters and
// vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter.
func (s *Server) adapterRoutes(r *gin.Engine) {
	r.GET("/admin/adapters", s.listAdapters)
	r.POST("/admin/adapters", func(c *gin.Context) {
		if info, ok := s.loadAdapter(c); ok {
			writeJSON(c, http.StatusOK, info)
		}
	})
	// A catch-all, as adapter names may hold slashes.
	r.DELETE("/admin/adapters/*name", func(c *gin.Context) {
		name := strings.TrimPrefix(c.Param("name"), "/")
		if s.unloadAdapter(c, name) {
			writeJSON(c, http.StatusOK, s.adaptersInfo())
		}
	})
	r.POST("/v1/load_lora_adapter", func(c *gin.Context) {
		if info, ok := s.loadAdapter(c); ok {
			c.String(http.StatusOK, "Success: LoRA adapter '%s' added successfully.", info.Name)
		}
	})
	r.POST("/v1/unload_lora_adapter", func(c *gin.Context) {
		var req engineapi.UnloadAdapterRequest
		if e := s.decodeBody(c, &req); e != nil {
			writeError(c, e)
			return
		}
		if req.Name == "" {
			writeError(c, openai.InvalidRequest("lora_name", "lora_name is required"))
			return
		}
		if s.unloadAdapter(c, req.Name) {
			c.String(http.StatusOK, "Success: LoRA adapter '%s' removed successfully.", req.Name)
		}
	})
}

// loraModel returns the loaded model (ready or asleep) whose adapters an
// admin request changes; LoRA must be on.
func (s *Server) loraModel() (*Loaded, *openai.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.shutdown:
		return nil, openai.Unavailable("the engine server is shutting down")
	case s.model == nil:
		return nil, openai.Unavailable("no model is loaded")
	case s.model.Adapters == nil:
		return nil, openai.InvalidRequest("", "LoRA is not enabled on this engine (start it with --enable-lora)")
	}
	return s.model, nil
}

// adaptersInfo is the GET /admin/adapters body: no slots and no adapters
// when LoRA is off.
func (s *Server) adaptersInfo() engineapi.AdaptersInfo {
	s.mu.Lock()
	l := s.model
	s.mu.Unlock()
	if l == nil || l.Adapters == nil {
		return engineapi.AdaptersInfo{Adapters: []engineapi.AdapterInfo{}}
	}
	return l.Adapters.Info()
}

func (s *Server) listAdapters(c *gin.Context) {
	s.mu.Lock()
	loaded := s.model != nil
	s.mu.Unlock()
	if !loaded {
		writeError(c, openai.Unavailable("no model is loaded"))
		return
	}
	writeJSON(c, http.StatusOK, s.adaptersInfo())
}

// loadAdapter registers the adapter a LoadAdapterRequest body names,
// checked against the loaded base now; when ok is false the error
// response is written.
func (s *Server) loadAdapter(c *gin.Context) (engineapi.AdapterInfo, bool) {
	var req engineapi.LoadAdapterRequest
	if e := s.decodeBody(c, &req); e != nil {
		writeError(c, e)
		return engineapi.AdapterInfo{}, false
	}
	l, e := s.loraModel()
	if e == nil {
		e = checkAdapterRequest(l, req)
	}
	if e != nil {
		writeError(c, e)
		return engineapi.AdapterInfo{}, false
	}
	info, created, err := l.Adapters.Register(c.Request.Context(), core.AdapterSpec{Name: req.Name, Path: req.Path, Revision: req.Revision})
	if err != nil {
		writeError(c, adapterError(err))
		return engineapi.AdapterInfo{}, false
	}
	if created {
		s.log.Info("LoRA adapter loaded", "model", l.Name, "adapter", req.Name, "path", req.Path, "rank", info.Rank)
	}
	return info, true
}

// checkAdapterRequest refuses a load whose fields are unusable.
func checkAdapterRequest(l *Loaded, req engineapi.LoadAdapterRequest) *openai.Error {
	if err := core.CheckAdapterName(req.Name); err != nil {
		return openai.InvalidRequest("lora_name", "lora_name: %v", err)
	}
	if req.Name == l.Name {
		return openai.InvalidRequest("lora_name", "lora_name %q is the base model's name", openai.Echo(req.Name))
	}
	if req.Path == "" {
		return openai.InvalidRequest("lora_path", "lora_path is required: the adapter's PEFT directory on this node, or its bucket prefix")
	}
	if req.Revision != "" && !isBucketPath(req.Path) {
		return openai.InvalidRequest("revision", "revision pins a bucket adapter (s3://… or file://…), not a directory on this node")
	}
	return nil
}

// unloadAdapter forgets an adapter; when ok is false the error response is
// written. An adapter requests use is refused with a 409.
func (s *Server) unloadAdapter(c *gin.Context, name string) bool {
	l, e := s.loraModel()
	if e != nil {
		writeError(c, e)
		return false
	}
	if err := l.Adapters.Unregister(name); err != nil {
		writeError(c, adapterError(err))
		return false
	}
	s.log.Info("LoRA adapter unloaded", "model", l.Name, "adapter", name)
	return true
}

// unknownAdapter is the 404 model_not_found of a request whose adapter
// was unloaded after its model name was checked.
func unknownAdapter(err error) *openai.Error {
	e := openai.ModelNotFound("")
	e.Message = fmt.Sprintf("The model does not exist: %v.", err)
	return e
}

// adapterError maps the adapter pool's and loader's errors to API errors:
// a missing path or adapter 404, a bad adapter 400, a taken name or an
// adapter in use 409.
func adapterError(err error) *openai.Error {
	var e *openai.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, core.ErrUnknownAdapter):
		return openai.NotFound("%v", err)
	case errors.Is(err, fs.ErrNotExist):
		e = openai.NotFound("%v", err)
		e.Param = "lora_path"
		return e
	case errors.Is(err, model.ErrInvalidAdapter):
		return openai.InvalidRequest("lora_path", "%v", err)
	case errors.Is(err, errors.ErrUnsupported):
		return openai.Unsupported("lora_path", "%v", err)
	case errors.Is(err, core.ErrAdapterExists), errors.Is(err, core.ErrAdapterInUse):
		return openai.Conflict("%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return openai.Unavailable("%v", err)
	}
	return openai.ServerError("%v", err)
}
