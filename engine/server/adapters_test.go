package server

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/synth"
)

// loraGate is the test gate over an executor that applies adapters.
type loraGate struct{ *gate }

func (g loraGate) BindAdapter(r *sched.Request, a *model.Adapter) {
	g.inner.(core.AdapterBinder).BindAdapter(r, a)
}

// loraModelConfig is the random model modelLoader serves.
func loraModelConfig() model.Config {
	return model.Config{ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
		HeadDim: 16, VocabSize: testVocab, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, HiddenAct: "silu", TieWordEmbeddings: true}
}

// loraFixture serves the random model with LoRA on (two slots) and reads
// adapters from PEFT directories; last is the gate of its engine.
type loraFixture struct {
	*fixture
	last *loraGate
}

func newLoRAFixture(t *testing.T) *loraFixture {
	t.Helper()
	ml := newModelLoader(t, true)
	lf := &loraFixture{}
	mc := loraModelConfig()
	o := EngineOptions{LoRA: LoRAOptions{Enabled: true, MaxLoras: 2}}
	load := func(ctx context.Context, req engineapi.LoadRequest, progress func(engineapi.LoadProgress)) (*Loaded, error) {
		m, err := model.New(mc, model.RandomSource(mc, 3, 0.3), ml.pool)
		if err != nil {
			return nil, err
		}
		pool, err := o.AdapterPool(func(ctx context.Context, spec core.AdapterSpec) (*model.Adapter, error) {
			return checkpoint.LoadAdapter(spec.Path, &mc, o.LoRA.WithDefaults().MaxRank)
		})
		if err != nil {
			return nil, err
		}
		return &Loaded{
			Name: testModel, Tokenizer: ml.tok, MaxModelLen: testCtx, VocabSize: testVocab, Adapters: pool,
			Start: func(metrics *core.Metrics) (*core.Engine, error) {
				storage, err := kvcache.New(m.KVShape(), testBlocks)
				if err != nil {
					return nil, err
				}
				g := &loraGate{&gate{inner: core.NewModelExecutor(m, storage), allow: -1}}
				lf.last = g
				cfg := core.Config{Sched: sched.Config{MaxNumBatchedTokens: 128, MaxNumSeqs: 16, MaxModelLen: testCtx}, EOS: ml.tok.EOS(), Adapters: pool}
				return core.New(cfg, kvcache.NewManager(testBlocks, true), g, ml.tok, metrics)
			},
			Close: func() error { pool.Close(); return nil },
		}, nil
	}
	lf.fixture = newFixture(t, load, "model", Options{})
	return lf
}

// writeAdapters writes the test adapters: a and b fit the served model,
// other is for another base, big has rank 32, corrupt holds no
// safetensors.
func writeAdapters(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	mc := loraModelConfig()
	other := mc
	other.IntermediateSize = 96
	paths := map[string]string{}
	for name, w := range map[string]struct {
		cfg  model.Config
		opts synth.AdapterOptions
	}{
		"a":     {mc, synth.AdapterOptions{Rank: 8, Seed: 1, Delta: 0.2}},
		"b":     {mc, synth.AdapterOptions{Rank: 4, TargetModules: []string{"q_proj", "v_proj"}, Seed: 2, Delta: 0.2}},
		"other": {other, synth.AdapterOptions{Rank: 8}},
		"big":   {mc, synth.AdapterOptions{Rank: 32}},
	} {
		paths[name] = filepath.Join(dir, name)
		if err := synth.WriteAdapter(paths[name], w.cfg, w.opts); err != nil {
			t.Fatal(err)
		}
	}
	paths["corrupt"] = filepath.Join(dir, "corrupt")
	if err := synth.WriteAdapter(paths["corrupt"], mc, synth.AdapterOptions{Rank: 8}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(paths["corrupt"], checkpoint.AdapterWeightsFile), []byte("not safetensors"), 0o644); err != nil {
		t.Fatal(err)
	}
	paths["missing"] = filepath.Join(dir, "missing")
	return paths
}

func (f *fixture) adapters(t *testing.T) engineapi.AdaptersInfo {
	t.Helper()
	status, b := f.do(t, http.MethodGet, "/admin/adapters", "")
	var info engineapi.AdaptersInfo
	if status != http.StatusOK || json.Unmarshal(b, &info) != nil {
		t.Fatalf("GET /admin/adapters: %d %s", status, b)
	}
	return info
}

// complete runs a greedy completion naming model and returns its text, or
// the status and body of a refusal.
func (f *fixture) complete(t *testing.T, model string) (status int, text, echoed string, body []byte) {
	t.Helper()
	status, body = f.do(t, http.MethodPost, "/v1/completions", jsonBody(map[string]any{
		"model": model, "prompt": []int{5, 9, 33, 2, 17, 80, 3}, "max_tokens": 12, "temperature": 0, "ignore_eos": true}))
	if status != http.StatusOK {
		return status, "", "", body
	}
	var resp openai.CompletionResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	return status, resp.Choices[0].Text, resp.Model, body
}

func errorOf(t *testing.T, body []byte) openai.ErrorDetail {
	t.Helper()
	var e openai.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error: %s", body)
	}
	return e.Error
}

func TestAdapterEndpoints(t *testing.T) {
	f := newLoRAFixture(t)
	paths := writeAdapters(t)
	if info := f.adapters(t); info.Slots != 2 || info.MaxRank != 16 || len(info.Adapters) != 0 {
		t.Fatalf("before any load: %+v", info)
	}
	var a engineapi.AdapterInfo
	f.postJSON(t, "/admin/adapters", jsonBody(engineapi.LoadAdapterRequest{Name: "a", Path: paths["a"]}), &a)
	if a.Name != "a" || a.Rank != 8 || !a.Loaded || a.Path != paths["a"] {
		t.Fatalf("POST /admin/adapters: %+v", a)
	}
	status, b := f.do(t, http.MethodPost, "/v1/load_lora_adapter", jsonBody(engineapi.LoadAdapterRequest{Name: "b", Path: paths["b"]}))
	if status != http.StatusOK || !strings.Contains(string(b), "Success: LoRA adapter 'b' added successfully.") {
		t.Fatalf("POST /v1/load_lora_adapter: %d %s", status, b)
	}
	for _, tc := range []struct {
		name   string
		req    engineapi.LoadAdapterRequest
		status int
		param  string
		want   string
	}{
		{"missing path", engineapi.LoadAdapterRequest{Name: "m", Path: paths["missing"]}, 404, "lora_path", "missing"},
		{"another base", engineapi.LoadAdapterRequest{Name: "o", Path: paths["other"]}, 400, "lora_path", "shape"},
		{"rank too big", engineapi.LoadAdapterRequest{Name: "g", Path: paths["big"]}, 400, "lora_path", "--max-lora-rank"},
		{"corrupt safetensors", engineapi.LoadAdapterRequest{Name: "c", Path: paths["corrupt"]}, 400, "lora_path", "safetensors"},
		{"separator in the name", engineapi.LoadAdapterRequest{Name: "x:y", Path: paths["a"]}, 400, "lora_name", `":"`},
		{"the base's name", engineapi.LoadAdapterRequest{Name: testModel, Path: paths["a"]}, 400, "lora_name", "base model"},
		{"no path", engineapi.LoadAdapterRequest{Name: "n"}, 400, "lora_path", "lora_path is required"},
		{"revision of a directory", engineapi.LoadAdapterRequest{Name: "r", Path: paths["a"], Revision: "abc"}, 400, "revision", "bucket"},
		{"name taken", engineapi.LoadAdapterRequest{Name: "a", Path: paths["b"]}, 409, "", "unload it first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/admin/adapters", "/v1/load_lora_adapter"} {
				status, b := f.do(t, http.MethodPost, path, jsonBody(tc.req))
				e := errorOf(t, b)
				if status != tc.status || !strings.Contains(e.Message, tc.want) || (tc.param != "" && (e.Param == nil || *e.Param != tc.param)) {
					t.Fatalf("POST %s: %d %s; want %d naming %q, param %q", path, status, b, tc.status, tc.want, tc.param)
				}
			}
		})
	}
	if info := f.adapters(t); len(info.Adapters) != 2 || info.Adapters[0].Name != "a" || info.Adapters[1].Name != "b" {
		t.Fatalf("refused loads changed the adapters: %+v", info)
	}
	// Loading a again from the same path is a no-op.
	f.postJSON(t, "/admin/adapters", jsonBody(engineapi.LoadAdapterRequest{Name: "a", Path: paths["a"]}), &a)

	var models openai.ModelList
	status, b = f.do(t, http.MethodGet, "/v1/models", "")
	if status != 200 || json.Unmarshal(b, &models) != nil || len(models.Data) != 3 {
		t.Fatalf("/v1/models: %d %s", status, b)
	}
	for i, want := range []openai.Model{{ID: testModel}, {ID: testModel + ":a", Parent: testModel}, {ID: testModel + ":b", Parent: testModel}} {
		if got := models.Data[i]; got.ID != want.ID || got.Parent != want.Parent || got.MaxModelLen != testCtx {
			t.Fatalf("/v1/models[%d] = %+v, want id %s parent %q", i, got, want.ID, want.Parent)
		}
	}
	for id, want := range map[string]int{testModel + ":a": 200, "a": 200, testModel + ":zz": 404, "zz": 404} {
		status, b := f.do(t, http.MethodGet, "/v1/models/"+id, "")
		var m openai.Model
		if status != want || (want == 200 && (json.Unmarshal(b, &m) != nil || m.ID != testModel+":a" || m.Parent != testModel)) {
			t.Fatalf("GET /v1/models/%s: %d %s, want %d", id, status, b, want)
		}
	}

	_, base, _, _ := f.complete(t, testModel)
	_, full, model1, _ := f.complete(t, testModel+":a")
	_, short, model2, _ := f.complete(t, "a")
	if full != short || full == base {
		t.Fatalf("greedy texts: base %q, tiny:a %q, a %q; want the adapter's the same both ways and not the base's", base, full, short)
	}
	if model1 != testModel+":a" || model2 != "a" {
		t.Fatalf("responses name %q and %q, want the requested names", model1, model2)
	}
	status, b = f.do(t, http.MethodPost, "/v1/chat/completions",
		`{"model":"tiny:b","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"ignore_eos":true}`)
	if status != http.StatusOK {
		t.Fatalf("chat with tiny:b: %d %s", status, b)
	}
	for _, name := range []string{testModel + ":zz", "zz", "other:a"} {
		status, _, _, b := f.complete(t, name)
		if e := errorOf(t, b); status != 404 || e.Code == nil || *e.Code != "model_not_found" {
			t.Fatalf("completion naming %s: %d %s, want 404 model_not_found", name, status, b)
		}
	}
	if got := f.metric(t, `stoke_engine_lora_requests_total{adapter="a",model_name="tiny"}`); got != 2 {
		t.Fatalf("stoke_engine_lora_requests_total of a: %v, want 2", got)
	}
	if got := f.metric(t, `stoke_engine_lora_generated_tokens_total{adapter="a",model_name="tiny"}`); got != 24 {
		t.Fatalf("stoke_engine_lora_generated_tokens_total of a: %v, want 24", got)
	}

	if status, b := f.do(t, http.MethodDelete, "/admin/adapters/a", ""); status != http.StatusOK {
		t.Fatalf("DELETE /admin/adapters/a: %d %s", status, b)
	}
	if status, _, _, b := f.complete(t, testModel+":a"); status != 404 {
		t.Fatalf("completion of an unloaded adapter: %d %s", status, b)
	}
	status, b = f.do(t, http.MethodPost, "/v1/unload_lora_adapter", `{"lora_name":"b"}`)
	if status != http.StatusOK || !strings.Contains(string(b), "Success: LoRA adapter 'b' removed successfully.") {
		t.Fatalf("POST /v1/unload_lora_adapter: %d %s", status, b)
	}
	for _, req := range []struct{ method, path, body string }{
		{http.MethodDelete, "/admin/adapters/b", ""},
		{http.MethodPost, "/v1/unload_lora_adapter", `{"lora_name":"zz"}`},
	} {
		if status, b := f.do(t, req.method, req.path, req.body); status != http.StatusNotFound {
			t.Fatalf("%s %s of an unknown adapter: %d %s", req.method, req.path, status, b)
		}
	}
	if info := f.adapters(t); len(info.Adapters) != 0 {
		t.Fatalf("after unloading both: %+v", info)
	}
}

// TestAdapterInUseIsNotUnloaded checks the unload of an adapter a request
// runs with: 409 until the request ends, then 200.
func TestAdapterInUseIsNotUnloaded(t *testing.T) {
	f := newLoRAFixture(t)
	paths := writeAdapters(t)
	var a engineapi.AdapterInfo
	f.postJSON(t, "/admin/adapters", jsonBody(engineapi.LoadAdapterRequest{Name: "a", Path: paths["a"]}), &a)
	f.last.set(0)
	s := f.openStream(t, "/v1/completions", `{"model":"tiny:a","prompt":"hi","max_tokens":8,"stream":true,"ignore_eos":true}`)
	waitFor(t, "the request to hold the adapter", func() bool { return f.adapters(t).Adapters[0].Running == 1 })
	status, b := f.do(t, http.MethodDelete, "/admin/adapters/a", "")
	if e := errorOf(t, b); status != http.StatusConflict || !strings.Contains(e.Message, "in use") {
		t.Fatalf("DELETE of an adapter in use: %d %s", status, b)
	}
	f.last.set(-1)
	for {
		if _, ok := s.next(t); !ok {
			break
		}
	}
	waitFor(t, "the request to let the adapter go", func() bool { return f.adapters(t).Adapters[0].Running == 0 })
	if status, b := f.do(t, http.MethodDelete, "/admin/adapters/a", ""); status != http.StatusOK {
		t.Fatalf("DELETE after the request ended: %d %s", status, b)
	}
}

func TestLoRADisabled(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	if info := f.adapters(t); info.Slots != 0 || len(info.Adapters) != 0 {
		t.Fatalf("GET /admin/adapters without LoRA: %+v", info)
	}
	status, b := f.do(t, http.MethodPost, "/admin/adapters", `{"lora_name":"a","lora_path":"/x"}`)
	if e := errorOf(t, b); status != http.StatusBadRequest || !strings.Contains(e.Message, "--enable-lora") {
		t.Fatalf("load without LoRA: %d %s", status, b)
	}
	if status, _, _, b := f.complete(t, testModel+":a"); status != http.StatusNotFound {
		t.Fatalf("adapter request without LoRA: %d %s", status, b)
	}
}

// TestSimLoaderServesAdapters checks that the sim engine registers
// adapters from their adapter_config.json (and bucket adapters as named)
// and serves requests naming them.
func TestSimLoaderServesAdapters(t *testing.T) {
	paths := writeAdapters(t)
	dora := filepath.Join(t.TempDir(), "dora")
	if err := os.MkdirAll(dora, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dora, model.AdapterConfigFile), []byte(`{"r":8,"lora_alpha":16,"target_modules":["q_proj"],"use_dora":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	o := EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 2048, MaxNumSeqs: 64}, PrefixCaching: true, ServedName: "sim",
		LoRA: LoRAOptions{Enabled: true, Modules: []core.AdapterSpec{{Name: "pre", Path: paths["b"]}}}}
	f := newFixture(t, SimLoader(o, ""), "llama-3.1-8b-fp8-h100", Options{})
	var info engineapi.AdapterInfo
	f.postJSON(t, "/admin/adapters", jsonBody(engineapi.LoadAdapterRequest{Name: "a", Path: paths["a"]}), &info)
	if info.Rank != 8 {
		t.Fatalf("sim adapter a: %+v", info)
	}
	f.postJSON(t, "/admin/adapters", jsonBody(engineapi.LoadAdapterRequest{Name: "s3", Path: "s3://bucket/sim/adapters/s3", Revision: "r1"}), &info)
	for _, tc := range []struct {
		path   string
		status int
	}{{dora, 400}, {paths["missing"], 404}} {
		if status, b := f.do(t, http.MethodPost, "/admin/adapters", jsonBody(engineapi.LoadAdapterRequest{Name: "x", Path: tc.path})); status != tc.status {
			t.Fatalf("sim load of %s: %d %s, want %d", tc.path, status, b, tc.status)
		}
	}
	if names := f.adapters(t).Adapters; len(names) != 3 || names[0].Name != "a" || names[1].Name != "pre" || names[2].Name != "s3" {
		t.Fatalf("sim adapters: %+v", names)
	}
	for _, model := range []string{"sim:a", "pre", "sim:s3"} {
		if status, _, _, b := f.complete(t, model); status != http.StatusOK {
			t.Fatalf("sim completion naming %s: %d %s", model, status, b)
		}
	}
}

func TestParseLoRAModules(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []core.AdapterSpec
		err  string
	}{
		{[]string{"a=/x", " b=/y/z "}, []core.AdapterSpec{{Name: "a", Path: "/x"}, {Name: "b", Path: "/y/z"}}, ""},
		{[]string{`{"name":"c","path":"s3://b/m/adapters/c","revision":"r1","base_model_name":"m"}`}, []core.AdapterSpec{{Name: "c", Path: "s3://b/m/adapters/c", Revision: "r1"}}, ""},
		{[]string{"a"}, nil, "name=path"},
		{[]string{"a="}, nil, "path is empty"},
		{[]string{"a:b=/x"}, nil, `":"`},
		{[]string{"a=/x", "a=/y"}, nil, "twice"},
		{[]string{`{"name":`}, nil, "lora-modules"},
	} {
		got, err := ParseLoRAModules(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Fatalf("%v: %v, %v", tc.in, got, err)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%v: %+v, want %+v", tc.in, got, tc.want)
			}
		}
	}
}
