package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
	"github.com/stokehq/stoke/weightstore/synth"
)

// pushTiny writes a synthetic tiny checkpoint, pushes it as NAME into a
// file:// bucket and returns the bucket's root URL and the revision.
func pushTiny(t *testing.T, name string) (root, revision string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "tiny", DType: dtype.F32, ShardSize: 128 << 10, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	root = "file://" + t.TempDir()
	out, err := stoke(t, "push", src, root+"/"+name)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return root, lines[len(lines)-1]
}

func TestPullCLI(t *testing.T) {
	root, rev := pushTiny(t, "tiny")
	cache := t.TempDir()
	for _, want := range []tier.Tier{tier.Bucket, tier.Cache} {
		out, err := stoke(t, "pull", root+"/tiny", "--cache-dir", cache, "--json")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var r pullReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if r.Tier != want || r.Revision != rev || r.Bytes == 0 || r.Bytes != r.FromBucket+r.FromCache {
			t.Fatalf("pull %+v, want tier %s of %s", r, want, rev)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pull", root + "/absent", "--no-cache"}, "not a pushed revision"},
		{[]string{"pull", root + "/tiny", "--no-cache", "--revision", "sha256:" + strings.Repeat("0", 64)}, "not hold the one asked for"},
		{[]string{"pull", root + "/tiny", "--no-cache", "--chunk-size", "0"}, "--chunk-size"},
		{[]string{"pull", "s3://", "--no-cache"}, "bucket"},
	} {
		if out, err := stoke(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q\n%s", tc.args, err, tc.want, out)
		}
	}
}

// TestEngineLoadsFromBucket runs `stoke engine --blank` and loads a pushed
// revision through POST /admin/load {"source","model"}: from the bucket,
// then, after an unload, from the node cache; /admin/state shows each
// load's tier and revision, and the model serves completions.
func TestEngineLoadsFromBucket(t *testing.T) {
	root, rev := pushTiny(t, "tiny")
	sock := filepath.Join(t.TempDir(), "e.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		cmd := newRootCmd()
		cmd.SetArgs([]string{"engine", "--blank", "--listen", "unix://" + sock, "--cache-dir", t.TempDir(), "--kv-cache-memory", "16MiB", "--threads", "1"})
		done <- cmd.ExecuteContext(ctx)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	}()
	client := &http.Client{Transport: unixTransport(sock, 0)}
	call := func(method, path, body string) (int, string) {
		t.Helper()
		for range 100 {
			req, _ := http.NewRequest(method, "http://engine"+path, strings.NewReader(body))
			resp, err := client.Do(req)
			if err != nil {
				time.Sleep(20 * time.Millisecond) // the listener is not up yet
				continue
			}
			defer resp.Body.Close()
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			return resp.StatusCode, b.String()
		}
		t.Fatal("the engine never answered")
		return 0, ""
	}
	for _, tier := range []string{"t3", "t2"} {
		status, body := call(http.MethodPost, "/admin/load", fmt.Sprintf(`{"source":%q,"model":"tiny"}`, root))
		if status != http.StatusOK {
			t.Fatalf("load: %d %s", status, body)
		}
		var st struct {
			State string `json:"state"`
			Model string `json:"model"`
			Load  struct {
				Tier     string `json:"tier"`
				Revision string `json:"revision"`
				Bytes    int64  `json:"bytes"`
				Total    int64  `json:"total_bytes"`
				Done     bool   `json:"done"`
			} `json:"load"`
		}
		_, body = call(http.MethodGet, "/admin/state", "")
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		if st.State != "ready" || st.Model != "tiny" || st.Load.Tier != tier || st.Load.Revision != rev || !st.Load.Done || st.Load.Bytes != st.Load.Total || st.Load.Total == 0 {
			t.Fatalf("state %s, want ready tiny loaded from %s at %s", body, tier, rev)
		}
		status, body = call(http.MethodPost, "/v1/completions", `{"model":"tiny","prompt":"hello","max_tokens":4,"ignore_eos":true}`)
		if status != http.StatusOK || !strings.Contains(body, `"completion_tokens":4`) {
			t.Fatalf("completion: %d %s", status, body)
		}
		if status, body := call(http.MethodPost, "/admin/unload", ""); status != http.StatusOK {
			t.Fatalf("unload: %d %s", status, body)
		}
	}
	status, body := call(http.MethodPost, "/admin/load", fmt.Sprintf(`{"source":%q,"model":"absent"}`, root))
	if status != http.StatusNotFound {
		t.Fatalf("load of a missing model: %d %s", status, body)
	}
	if !strings.Contains(body, "not a pushed revision") || !strings.Contains(body, `"error"`) {
		t.Fatalf("load of a missing model: %s", body)
	}
}

func TestWatchCLI(t *testing.T) {
	root, rev := pushTiny(t, "tiny")
	state := filepath.Join(t.TempDir(), "state.db")
	out, err := stoke(t, "watch", root, "--state", state, "--once")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var line revisionLine
	if err := json.Unmarshal([]byte(out), &line); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if line.Model != "tiny" || line.Revision != rev || line.State != "ready" {
		t.Fatalf("watch printed %+v, want tiny %s ready", line, rev)
	}
	if out, err := stoke(t, "watch", root, "--state", state, "--once"); err != nil || out != "" {
		t.Fatalf("second scan: %v %q, want nothing new", err, out)
	}
}

// TestPullSurvivesSIGKILL kills `stoke pull` with SIGKILL halfway through
// writing the node cache, then pulls again: nothing half-written is ever
// served, the next pull re-fetches and verifies, and the one after is t2.
func TestPullSurvivesSIGKILL(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "small", DType: dtype.F32, ShardSize: 4 << 20, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	root := "file://" + t.TempDir()
	out, err := stoke(t, "push", src, root+"/small")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	rev := lines[len(lines)-1]
	var size int64
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		info, _ := e.Info()
		size += info.Size()
	}
	caches := map[string]func(t *testing.T) []string{
		"dir":        func(t *testing.T) []string { return []string{"--cache-dir", t.TempDir()} },
		"containerd": func(t *testing.T) []string { return []string{"--containerd-socket", ctrdtest.Start(t)} },
	}
	for name, cacheArgs := range caches {
		t.Run(name, func(t *testing.T) {
			cache := cacheArgs(t)
			cmd := exec.Command(os.Args[0], append([]string{"pull", root + "/small", "--parallel", "1", "--chunk-size", "4KiB"}, cache...)...)
			cmd.Env = append(os.Environ(), runMainEnv+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// Kill once the process has read half the checkpoint.
			for readBytes(cmd.Process.Pid) < size/2 {
				select {
				case <-exited:
					t.Fatalf("pull ended before it was killed: %s", stderr.String())
				case <-time.After(time.Millisecond):
				}
			}
			cmd.Process.Signal(syscall.SIGKILL)
			if err := <-exited; err == nil {
				t.Fatalf("pull finished before the kill; make the checkpoint bigger")
			}
			for i, want := range []tier.Tier{tier.Bucket, tier.Cache} {
				out, err := stoke(t, append([]string{"pull", root + "/small", "--json"}, cache...)...)
				if err != nil {
					t.Fatalf("pull %d after the kill: %v\n%s", i+1, err, out)
				}
				var r pullReport
				if err := json.Unmarshal([]byte(out), &r); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				if r.Tier != want || r.Revision != rev {
					t.Fatalf("pull %d after the kill: %+v, want tier %s", i+1, r, want)
				}
			}
		})
	}
}

// readBytes is how many bytes process pid has read so far (/proc/PID/io).
func readBytes(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
