package main

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestServeFiles: serve keeps uploaded files in its files store
// (file://DATA/files by default) and serves them back.
func TestServeFiles(t *testing.T) {
	data := t.TempDir()
	args := []string{"--data", data, "--warm", "0", "--sim-profile", "llama-3.1-8b-fp8-h100"}
	base := startServe(t, nil, args...)
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	content := `{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":"hi"}}` + "\n"
	io.WriteString(fw, content)
	mw.Close()
	resp, err := http.Post(base+"/v1/files", mw.FormDataContentType(), &body)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		ID    string `json:"id"`
		Bytes int    `json:"bytes"`
	}
	json.NewDecoder(resp.Body).Decode(&f)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || f.ID == "" || f.Bytes != len(content) {
		t.Fatalf("upload: %d %+v", resp.StatusCode, f)
	}
	entries, err := os.ReadDir(filepath.Join(data, "files"))
	if err != nil || len(entries) == 0 {
		t.Fatalf("nothing under DATA/files (%v)", err)
	}
	resp, err = http.Get(base + "/v1/files/" + f.ID + "/content")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != content {
		t.Fatalf("content %q, want %q", got, content)
	}
}
