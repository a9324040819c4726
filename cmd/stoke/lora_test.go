package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/synth"
)

// TestEngineLoRAFlagErrors checks that LoRA flags that cannot work stop
// `stoke engine` at startup with exit status 1 and one line naming the
// problem.
func TestEngineLoRAFlagErrors(t *testing.T) {
	sock := "unix://" + filepath.Join(t.TempDir(), "e.sock")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--lora-modules", "a=/x"}, "--lora-modules needs --enable-lora"},
		{[]string{"--enable-lora", "--lora-modules", "a"}, "want name=path"},
		{[]string{"--enable-lora", "--max-loras", "0"}, "--max-loras must be positive"},
		{[]string{"--enable-lora", "--max-lora-rank", "-1"}, "--max-lora-rank must be positive"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"engine", "--blank", "--listen", sock}, tc.args...)
			code, stderr := stokeProcess(t, nil, time.Minute, args...)
			line := strings.TrimSuffix(stderr, "\n")
			if code != 1 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "stoke: ") || !strings.Contains(line, tc.want) {
				t.Fatalf("exit %d, stderr %q: want exit 1 and one line \"stoke: …%s…\"", code, stderr, tc.want)
			}
		})
	}
}

// TestEngineServesLoRAModules runs `stoke engine --model stories260K
// --enable-lora --lora-modules a=DIR` and checks the adapter is listed as
// a model of its own and serves completions.
func TestEngineServesLoRAModules(t *testing.T) {
	stories := testmodel.Dir(t)
	ck, err := checkpoint.Open(stories)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ck.Config()
	ck.Close()
	adapter := filepath.Join(t.TempDir(), "a")
	if err := synth.WriteAdapter(adapter, cfg, synth.AdapterOptions{Rank: 8, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], "engine", "--model", stories, "--listen", addr, "--kv-cache-memory", "16MiB",
		"--enable-lora", "--max-loras", "2", "--lora-modules", "a="+adapter)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine never became healthy")
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models openai.ModelList
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) != 2 || models.Data[1].ID != "stories260K:a" || models.Data[1].Parent != "stories260K" {
		t.Fatalf("/v1/models: %+v (%v)", models, err)
	}
	resp, err = http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"stories260K:a","prompt":"Once upon a time","max_tokens":8,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	var out openai.CompletionResponse
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || out.Model != "stories260K:a" || len(out.Choices) != 1 || out.Usage.CompletionTokens == 0 {
		t.Fatalf("completion with the adapter: %d %+v (%v)", resp.StatusCode, out, err)
	}
}
