package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/stokehq/stoke/batch/files"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
)

const batchLine = `{"custom_id":"req-1","method":"POST","url":"/v1/chat/completions","body":{"model":"chat","messages":[{"role":"user","content":"hi"}]}}` + "\n"

// filesServer serves the API with a files store of small limits on a
// file:// blob store; it returns the server and the blob store.
func filesServer(t *testing.T, maxBytes int64, maxLines int) (*httptest.Server, bucket.Bucket) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := bucket.Open(ctx, "file://"+filepath.Join(t.TempDir(), "files"), bucket.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := files.New(files.Options{Blobs: b, Meta: st, MaxBytes: maxBytes, MaxLines: maxLines})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Options{Deployments: storeDeployments{st}, Files: fs}))
	t.Cleanup(srv.Close)
	return srv, b
}

func TestFilesWithOpenAIClient(t *testing.T) {
	ctx := context.Background()
	srv, _ := filesServer(t, 1<<20, 100)
	client := oai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))

	var uploaded []*oai.FileObject
	var contents []string
	for i := range 3 {
		content := strings.Repeat(batchLine, i+1)
		f, err := client.Files.New(ctx, oai.FileNewParams{
			File:    oai.File(strings.NewReader(content), "input.jsonl", "application/jsonl"),
			Purpose: oai.FilePurposeBatch,
		})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(f.ID, "file-") || f.Object != "file" || f.Bytes != int64(len(content)) || f.Filename != "input.jsonl" ||
			f.Purpose != oai.FileObjectPurposeBatch || f.Status != oai.FileObjectStatusProcessed || f.CreatedAt == 0 {
			t.Errorf("upload %d = %+v", i, f)
		}
		if f.JSON.ExpiresAt.Raw() != "null" {
			t.Errorf("expires_at = %q, want null", f.JSON.ExpiresAt.Raw())
		}
		uploaded, contents = append(uploaded, f), append(contents, content)
	}

	got, err := client.Files.Get(ctx, uploaded[1].ID)
	if err != nil || got.ID != uploaded[1].ID || got.Bytes != uploaded[1].Bytes {
		t.Errorf("Get = %+v, %v", got, err)
	}
	for i, f := range uploaded {
		resp, err := client.Files.Content(ctx, f.ID)
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(data, []byte(contents[i])) {
			t.Errorf("content of %s = %q, %v; want %q", f.ID, data, err, contents[i])
		}
	}

	// Pages of two, oldest first, then the rest after the last one.
	page, err := client.Files.List(ctx, oai.FileListParams{Limit: oai.Int(2), Order: oai.FileListParamsOrderAsc, Purpose: oai.String("batch")})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 2 || page.Data[0].ID != uploaded[0].ID || page.Data[1].ID != uploaded[1].ID || !page.HasMore {
		t.Errorf("first page = %d files, has_more %v", len(page.Data), page.HasMore)
	}
	page, err = client.Files.List(ctx, oai.FileListParams{Limit: oai.Int(2), Order: oai.FileListParamsOrderAsc, After: oai.String(page.Data[1].ID)})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != uploaded[2].ID || page.HasMore {
		t.Errorf("second page = %+v, has_more %v", page.Data, page.HasMore)
	}
	// The client's auto-pager walks every page, newest first by default.
	var walked []string
	iter := client.Files.ListAutoPaging(ctx, oai.FileListParams{Limit: oai.Int(1)})
	for iter.Next() {
		walked = append(walked, iter.Current().ID)
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{uploaded[2].ID, uploaded[1].ID, uploaded[0].ID}; strings.Join(walked, ",") != strings.Join(want, ",") {
		t.Errorf("auto-paged %v, want %v", walked, want)
	}
	if page, err := client.Files.List(ctx, oai.FileListParams{Purpose: oai.String("assistants")}); err != nil || len(page.Data) != 0 {
		t.Errorf("list of another purpose = %v, %v; want none", page, err)
	}

	del, err := client.Files.Delete(ctx, uploaded[0].ID)
	if err != nil || !del.Deleted || del.ID != uploaded[0].ID || del.Object != "file" {
		t.Errorf("Delete = %+v, %v", del, err)
	}
	_, err = client.Files.Get(ctx, uploaded[0].ID)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Param != "id" {
		t.Errorf("Get after delete: %v, want a 404 naming param id", err)
	}
}

// part is one part of a multipart form; a file part has a filename.
type part struct{ name, filename, content string }

func form(parts ...part) (io.Reader, string) {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for _, p := range parts {
		var pw io.Writer
		if p.filename != "" {
			pw, _ = w.CreateFormFile(p.name, p.filename)
		} else {
			pw, _ = w.CreateFormField(p.name)
		}
		io.WriteString(pw, p.content)
	}
	w.Close()
	return &buf, w.FormDataContentType()
}

func TestFilesErrors(t *testing.T) {
	const maxLines = 3
	maxBytes := int64(4 * len(batchLine))
	srv, blobs := filesServer(t, maxBytes, maxLines)
	lines := func(n int) string { return strings.Repeat(batchLine, n) }
	file := func(content string) part { return part{"file", "input.jsonl", content} }
	batch := part{"purpose", "", "batch"}
	big := lines(4) + "x" // one byte over the limit

	for _, c := range []struct {
		name         string
		method, path string
		parts        []part
		contentType  string // overrides the form's
		status       int
		param, code  string
	}{
		{"oversize", "POST", "/v1/files", []part{batch, file(big)}, "", 413, "file", "file_too_large"},
		{"oversize, purpose last", "POST", "/v1/files", []part{file(big), batch}, "", 413, "file", "file_too_large"},
		{"oversize by content length", "POST", "/v1/files", []part{batch, file(strings.Repeat("x", 2<<20))}, "", 413, "file", "file_too_large"},
		{"too many lines", "POST", "/v1/files", []part{batch, file(strings.Repeat("{}\n", maxLines+1))}, "", 400, "file", "too_many_lines"},
		{"bad purpose", "POST", "/v1/files", []part{{"purpose", "", "fine-tune"}, file(lines(1))}, "", 400, "purpose", ""},
		{"bad purpose after the file", "POST", "/v1/files", []part{file(lines(1)), {"purpose", "", "assistants"}}, "", 400, "purpose", ""},
		{"missing file", "POST", "/v1/files", []part{batch}, "", 400, "file", ""},
		{"missing purpose", "POST", "/v1/files", []part{file(lines(1))}, "", 400, "purpose", ""},
		{"two files", "POST", "/v1/files", []part{batch, file(lines(1)), file(lines(1))}, "", 400, "file", ""},
		{"empty file", "POST", "/v1/files", []part{batch, file("")}, "", 400, "file", ""},
		{"not jsonl", "POST", "/v1/files", []part{batch, {"file", "input.csv", lines(1)}}, "", 400, "file", ""},
		{"not multipart", "POST", "/v1/files", nil, "application/json", 400, "file", ""},
		{"unknown id", "GET", "/v1/files/file-nope", nil, "", 404, "id", ""},
		{"unknown id content", "GET", "/v1/files/file-nope/content", nil, "", 404, "id", ""},
		{"unknown id delete", "DELETE", "/v1/files/file-nope", nil, "", 404, "id", ""},
		{"bad limit", "GET", "/v1/files?limit=0", nil, "", 400, "limit", ""},
		{"bad order", "GET", "/v1/files?order=sideways", nil, "", 400, "order", ""},
		{"unknown after", "GET", "/v1/files?after=file-nope", nil, "", 400, "after", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, ct := form(c.parts...)
			if c.contentType != "" {
				ct = c.contentType
			}
			if c.method != "POST" {
				body = nil
			}
			req, _ := http.NewRequest(c.method, srv.URL+c.path, body)
			req.Header.Set("Content-Type", ct)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("status %d, body not an OpenAI error: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != c.status || e.Error.Param == nil || *e.Error.Param != c.param || e.Error.Message == "" ||
				e.Error.Type != "invalid_request_error" {
				t.Errorf("status %d, error %+v (param %v); want %d naming %q", resp.StatusCode, e.Error, deref(e.Error.Param), c.status, c.param)
			}
			if c.code != "" && (e.Error.Code == nil || *e.Error.Code != c.code) {
				t.Errorf("code = %v, want %q", deref(e.Error.Code), c.code)
			}
			// A refused upload leaves nothing behind.
			if objs, err := blobs.List(context.Background(), ""); err != nil || len(objs) != 0 {
				t.Errorf("blob store holds %v (%v) after a refused request", objs, err)
			}
		})
	}
}

func deref(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestFilesUnmountedWithoutStore(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(New(Options{Deployments: storeDeployments{st}}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/files")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/files without a files store: %d, want 404", resp.StatusCode)
	}
}
