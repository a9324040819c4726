package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/api/tenancy"
	"github.com/stokehq/stoke/batch"
	"github.com/stokehq/stoke/batch/files"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
)

// tenantHeader names the tenant a test request authenticates as; a
// request without it has no principal (auth off, owner "").
const tenantHeader = "X-Test-Tenant"

// testTenancy is the test's stand-in for authentication: it puts the
// principal of the tenant named in tenantHeader in the request's context.
func testTenancy(c *gin.Context) {
	if id := c.GetHeader(tenantHeader); id != "" {
		p := tenancy.Principal{TenantID: id, KeyID: "key-" + id}
		c.Request = c.Request.WithContext(tenancy.WithPrincipal(c.Request.Context(), p))
	}
}

// noModels serves no model: the batches of the isolation test are never
// run, so the activator behind them needs none.
type noModels struct{}

func (noModels) Lookup(string) (string, config.Spec, bool) { return "", config.Spec{}, false }
func (noModels) Poke(string)                               {}
func (noModels) Known(string) bool                         { return false }

// isolationServer serves the API with real files and batch stores (on a
// real activator with no replicas) behind testTenancy. The batch runner
// is not started: every batch stays where its requests put it.
func isolationServer(t *testing.T) *httptest.Server {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := bucket.Open(ctx, "file://"+filepath.Join(t.TempDir(), "files"), bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := files.New(files.Options{Blobs: blobs, Meta: st})
	if err != nil {
		t.Fatal(err)
	}
	act := activator.New(activator.Options{Resolver: noModels{}})
	bs, err := batch.New(batch.Options{Store: st, Files: fs, Dispatcher: act, Models: noModels{},
		Priority: activator.PriorityBatch, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Options{Deployments: storeDeployments{st}, Files: fs, Batches: bs,
		Middleware: []gin.HandlerFunc{testTenancy}}))
	t.Cleanup(srv.Close)
	return srv
}

// tenantClient makes requests to the API as one tenant ("" for none).
type tenantClient struct {
	t      *testing.T
	url    string
	tenant string
}

// do sends a request and returns the answer's status and body.
func (c tenantClient) do(method, path string, body io.Reader, contentType string) (int, string) {
	c.t.Helper()
	headers := map[string]string{}
	if contentType != "" {
		headers["Content-Type"] = contentType
	}
	if c.tenant != "" {
		headers[tenantHeader] = c.tenant
	}
	resp, b := send(c.t, method, c.url+path, body, headers)
	return resp.StatusCode, b
}

// ok sends a request that must succeed and decodes its answer into out.
func (c tenantClient) ok(method, path, body, contentType string, out any) {
	c.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	status, got := c.do(method, path, r, contentType)
	if status != http.StatusOK {
		c.t.Fatalf("%s %s as %q = %d %s", method, path, c.tenant, status, got)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(got), out); err != nil {
			c.t.Fatalf("%s %s as %q: %v in %s", method, path, c.tenant, err, got)
		}
	}
}

// upload uploads content as a batch input file and returns its id.
func (c tenantClient) upload(content string) string {
	c.t.Helper()
	body, ct := form(part{"purpose", "", "batch"}, part{"file", "input.jsonl", content})
	status, got := c.do(http.MethodPost, "/v1/files", body, ct)
	var f fileObject
	if status != http.StatusOK || json.Unmarshal([]byte(got), &f) != nil || f.ID == "" {
		c.t.Fatalf("upload as %q = %d %s", c.tenant, status, got)
	}
	return f.ID
}

// createBatch creates a batch from the file fileID and returns its id.
func (c tenantClient) createBatch(fileID string) string {
	c.t.Helper()
	var b batchObject
	c.ok(http.MethodPost, "/v1/batches", batchRequest(fileID), "application/json", &b)
	if b.ID == "" || b.InputFileID != fileID || b.Status != string(store.BatchValidating) {
		c.t.Fatalf("created batch %+v", b)
	}
	return b.ID
}

func batchRequest(fileID string) string {
	return `{"input_file_id":"` + fileID + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`
}

// ids lists the ids of a list answer's items, in order.
func (c tenantClient) ids(path string) []string {
	c.t.Helper()
	var page struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	c.ok(http.MethodGet, path, "", "", &page)
	out := []string{}
	for _, d := range page.Data {
		out = append(out, d.ID)
	}
	return out
}

// TestTenantIsolation: over real HTTP, a tenant can neither see, read,
// list, delete nor cancel another tenant's files and batches, nor create a
// batch from another's file, and every refusal is the very answer an
// unknown id gets (nothing tells that the thing exists); the owner keeps
// full use of its own. A request without a tenant (auth off) owns as "",
// isolated like any tenant.
func TestTenantIsolation(t *testing.T) {
	srv := isolationServer(t)
	a := tenantClient{t, srv.URL, "tenant-a"}
	b := tenantClient{t, srv.URL, "tenant-b"}
	none := tenantClient{t, srv.URL, ""}

	fileA := a.upload(batchLine)
	fileA2 := a.upload(batchLine + batchLine)
	batchA := a.createBatch(fileA)
	batchA2 := a.createBatch(fileA2)
	fileB := b.upload(batchLine)
	batchB := b.createBatch(fileB)
	fileN := none.upload(batchLine)
	batchN := none.createBatch(fileN)

	const unknownFile, unknownBatch = "file-zzzzzzzzzzzzzzzzzzzzzzzzzz", "batch_000000000000000000000000"
	type probe struct {
		name, method, path, body string
		unknown                  string // the id the probe's path or body names, unknown
		status                   int
	}
	probes := func(file, batchID string) []probe {
		return []probe{
			{"file get", http.MethodGet, "/v1/files/" + file, "", unknownFile, http.StatusNotFound},
			{"file content", http.MethodGet, "/v1/files/" + file + "/content", "", unknownFile, http.StatusNotFound},
			{"file delete", http.MethodDelete, "/v1/files/" + file, "", unknownFile, http.StatusNotFound},
			{"batch get", http.MethodGet, "/v1/batches/" + batchID, "", unknownBatch, http.StatusNotFound},
			{"batch cancel", http.MethodPost, "/v1/batches/" + batchID + "/cancel", "", unknownBatch, http.StatusNotFound},
			{"batch from the file", http.MethodPost, "/v1/batches", batchRequest(file), unknownFile, http.StatusNotFound},
			{"files after the file", http.MethodGet, "/v1/files?after=" + file, "", unknownFile, http.StatusBadRequest},
			{"batches after the batch", http.MethodGet, "/v1/batches?after=" + batchID, "", unknownBatch, http.StatusBadRequest},
		}
	}
	for _, c := range []struct {
		viewer        tenantClient
		owner         string
		file, batchID string
	}{
		{b, "tenant-a", fileA, batchA},
		{none, "tenant-a", fileA, batchA},
		{a, "tenant-b", fileB, batchB},
		{a, "no tenant", fileN, batchN},
	} {
		for _, p := range probes(c.file, c.batchID) {
			t.Run(fmt.Sprintf("%s as %q of %s's", p.name, c.viewer.tenant, c.owner), func(t *testing.T) {
				c.viewer.t = t
				send := func(path, body string) (int, string) {
					var r io.Reader
					if body != "" {
						r = strings.NewReader(body)
					}
					return c.viewer.do(p.method, path, r, "application/json")
				}
				id := c.file
				if p.unknown == unknownBatch {
					id = c.batchID
				}
				status, got := send(p.path, p.body)
				ustatus, ugot := send(strings.ReplaceAll(p.path, id, p.unknown), strings.ReplaceAll(p.body, id, p.unknown))
				if status != p.status {
					t.Errorf("answer %d %s, want %d", status, got, p.status)
				}
				if status != ustatus || got != strings.ReplaceAll(ugot, p.unknown, id) {
					t.Errorf("answer %d %s\n  unknown id's: %d %s", status, got, ustatus, ugot)
				}
				var e struct {
					Error struct {
						Message string  `json:"message"`
						Type    string  `json:"type"`
						Param   *string `json:"param"`
					} `json:"error"`
				}
				if err := json.Unmarshal([]byte(got), &e); err != nil || e.Error.Type != "invalid_request_error" ||
					!strings.Contains(e.Error.Message, id) || e.Error.Param == nil {
					t.Errorf("answer %s is not an OpenAI error naming %s (%v)", got, id, err)
				}
				if p.status == http.StatusNotFound && !strings.HasPrefix(e.Error.Message, "No such ") {
					t.Errorf("message %q, want OpenAI's \"No such … object\"", e.Error.Message)
				}
			})
		}
	}

	// Lists hold the caller's own only, whatever was refused above.
	for _, c := range []struct {
		viewer         tenantClient
		files, batches []string
	}{
		{a, []string{fileA2, fileA}, []string{batchA2, batchA}},
		{b, []string{fileB}, []string{batchB}},
		{none, []string{fileN}, []string{batchN}},
		{tenantClient{t, srv.URL, "tenant-c"}, []string{}, []string{}},
	} {
		if got := c.viewer.ids("/v1/files"); fmt.Sprint(got) != fmt.Sprint(c.files) {
			t.Errorf("files listed as %q = %v, want %v", c.viewer.tenant, got, c.files)
		}
		if got := c.viewer.ids("/v1/files?order=asc&purpose=batch"); len(got) != len(c.files) {
			t.Errorf("batch files listed oldest first as %q = %v, want %d", c.viewer.tenant, got, len(c.files))
		}
		if got := c.viewer.ids("/v1/batches"); fmt.Sprint(got) != fmt.Sprint(c.batches) {
			t.Errorf("batches listed as %q = %v, want %v", c.viewer.tenant, got, c.batches)
		}
	}
	// The owner's own cursors still page.
	if got := a.ids("/v1/files?limit=1&after=" + fileA2); fmt.Sprint(got) != fmt.Sprint([]string{fileA}) {
		t.Errorf("tenant-a's files after its own = %v, want [%s]", got, fileA)
	}
	if got := a.ids("/v1/batches?limit=1&after=" + batchA2); fmt.Sprint(got) != fmt.Sprint([]string{batchA}) {
		t.Errorf("tenant-a's batches after its own = %v, want [%s]", got, batchA)
	}

	// The owner still has everything, untouched by the refused delete and
	// cancel, and may use it all.
	var f fileObject
	a.ok(http.MethodGet, "/v1/files/"+fileA, "", "", &f)
	if f.ID != fileA || f.Bytes != int64(len(batchLine)) {
		t.Errorf("tenant-a's file = %+v", f)
	}
	if status, got := a.do(http.MethodGet, "/v1/files/"+fileA+"/content", nil, ""); status != http.StatusOK || got != batchLine {
		t.Errorf("tenant-a's content = %d %q, want %q", status, got, batchLine)
	}
	var bo batchObject
	a.ok(http.MethodGet, "/v1/batches/"+batchA, "", "", &bo)
	if bo.ID != batchA || bo.Status != string(store.BatchValidating) {
		t.Errorf("tenant-a's batch after another's cancel = %+v, want it validating", bo)
	}
	a.ok(http.MethodPost, "/v1/batches/"+batchA+"/cancel", "", "", &bo)
	if bo.ID != batchA || bo.Status != string(store.BatchCancelling) {
		t.Errorf("tenant-a's cancel = %+v, want cancelling", bo)
	}
	var del struct {
		ID      string `json:"id"`
		Deleted bool   `json:"deleted"`
	}
	a.ok(http.MethodDelete, "/v1/files/"+fileA2, "", "", &del)
	if del.ID != fileA2 || !del.Deleted {
		t.Errorf("tenant-a's delete = %+v", del)
	}
	if status, got := a.do(http.MethodGet, "/v1/files/"+fileA2, nil, ""); status != http.StatusNotFound {
		t.Errorf("tenant-a's deleted file = %d %s, want 404", status, got)
	}
	a.createBatch(fileA)
	// Nor did the refusals touch the others' things.
	b.ok(http.MethodGet, "/v1/files/"+fileB, "", "", nil)
	none.ok(http.MethodGet, "/v1/batches/"+batchN, "", "", &bo)
	if bo.Status != string(store.BatchValidating) {
		t.Errorf("no tenant's batch = %+v, want it validating", bo)
	}
}
