package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/scaler/reconcile"
	"github.com/stokehq/stoke/weightstore/bucket/bucketest"
	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/synth"
)

// freeAddr returns a loopback address no one listens on just now.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServe runs `stoke serve` as its own process (its runtimes are
// processes of this test binary too) and returns its base URL.
func startServe(t testing.TB, env []string, args ...string) string {
	t.Helper()
	s := launchServe(t, env, freeAddr(t), args...)
	s.waitHealthy(t)
	return s.base
}

// serveProc is a `stoke serve` process a test started.
type serveProc struct {
	base, logPath string
	cmd           *exec.Cmd
	done          chan struct{} // closed once it exited
	err           error         // its exit, once done
}

// launchServe starts `stoke serve --listen addr ARGS…` without waiting for
// it to answer. At the end of the test it is stopped with SIGTERM (unless
// it already exited), its log is shown if the test failed, and a data race
// it reported fails the test: the race pass runs serve built with -race.
func launchServe(t testing.TB, env []string, addr string, args ...string) *serveProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--listen", addr}, args...)...)
	cmd.Env = append(append(os.Environ(), runMainEnv+"=1"), env...)
	logPath := filepath.Join(t.TempDir(), "serve.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logFile.Close()
	s := &serveProc{base: "http://" + addr, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.done:
			case <-time.After(30 * time.Second):
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-s.done
				t.Error("stoke serve did not stop on SIGTERM")
			}
		}
		log := s.log()
		if strings.Contains(log, "WARNING: DATA RACE") {
			t.Error("stoke serve reported a data race")
		}
		if t.Failed() {
			t.Logf("stoke serve's log:\n%s", log)
		}
	})
	return s
}

// waitHealthy waits until serve answers /health, failing at once if it
// exits first.
func (s *serveProc) waitHealthy(t testing.TB) {
	t.Helper()
	waitUntil(t, "stoke serve answers", 30*time.Second, func() bool {
		select {
		case <-s.done:
			t.Fatalf("stoke serve exited before it answered: %v\n%s", s.err, s.log())
		default:
		}
		resp, err := http.Get(s.base + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
}

// log is what serve printed so far.
func (s *serveProc) log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

func waitUntil(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getJSON(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// coldStarts reads stoke_cold_starts_total by tier for a deployment (the
// causes summed).
func coldStarts(t *testing.T, base, deployment string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "stoke_cold_starts_total{") || !strings.Contains(line, `deployment="`+deployment+`"`) {
			continue
		}
		i := strings.Index(line, `tier="`)
		tier := line[i+6 : i+8]
		var v float64
		fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
		out[tier] += v // over the causes
	}
	return out
}

// TestServeEndToEnd pushes a synthetic model to MinIO with `stoke push`,
// serves the bucket with `stoke serve` and checks the platform's promise:
// listed within 10 s and prefetched into the node cache, the first request
// with zero replicas streams through the OpenAI SDK without waiting for a
// runtime start (warm pool of 1) and loads from the node cache (t2), the
// replica is released after the idle delay, and the next request is served
// from sleep (t1) or the node cache (t2).
func TestServeEndToEnd(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "stoke.yaml"), []byte("replicas:\n  min: 0\n  max: 2\nwindow: 2s\nidle_delay: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ep, ak, sk := bucketest.StartMinIO(t)
	bucketest.MakeBucket(t, ep, ak, sk, "models")
	env := []string{"AWS_ACCESS_KEY_ID=" + ak, "AWS_SECRET_ACCESS_KEY=" + sk, "AWS_ENDPOINT_URL=" + ep, "AWS_REGION=us-east-1"}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
	if out, err := stoke(t, "push", src, "s3://models/tiny", "--path-style"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	data := t.TempDir()
	base := startServe(t, env, "--data", data, "--bucket", "s3://models", "--path-style", "--watch-interval", "200ms",
		"--warm", "1", "--slots", "2", "--kv-cache-memory", "16MiB", "--threads", "1")

	listed := time.Now()
	waitUntil(t, "tiny is listed in /v1/models", 10*time.Second, func() bool {
		var models struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		getJSON(t, base+"/v1/models", &models)
		return len(models.Data) == 1 && models.Data[0].ID == "tiny"
	})
	t.Logf("listed %v after serve answered", time.Since(listed))
	waitUntil(t, "the warm pool holds a blank runtime", 30*time.Second, func() bool {
		return runtimesIn(t, base, "blank", "") == 1
	})
	var dep struct {
		Revision string `json:"revision"`
	}
	getJSON(t, base+"/admin/deployments/tiny", &dep)
	cache, err := nodecache.NewDir(filepath.Join(data, "cache"), nodecache.DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the deployed revision is prefetched into the node cache", 30*time.Second, func() bool {
		v, err := cache.OpenRevision(context.Background(), dep.Revision)
		if err != nil {
			return false
		}
		v.Close()
		return true
	})

	client := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	chat := func() string {
		t.Helper()
		stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
			Model:     "tiny",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")},
			MaxTokens: openai.Int(8),
		}, option.WithJSONSet("ignore_eos", true))
		var text strings.Builder
		chunks := 0
		for stream.Next() {
			chunks++
			if c := stream.Current(); len(c.Choices) > 0 {
				text.WriteString(c.Choices[0].Delta.Content)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("streaming chat: %v", err)
		}
		if chunks < 2 {
			t.Fatalf("%d chunks streamed, want several", chunks)
		}
		return text.String()
	}
	chat()
	first := coldStarts(t, base, "tiny")
	if first["t4"] != 0 || first["t3"] != 0 || first["t2"] != 1 {
		t.Fatalf("first request's acquisitions %v: want one t2 (the warm pool, the prefetched node cache), no runtime start", first)
	}

	// After the idle delay the replica goes to sleep (or back to blank).
	waitUntil(t, "the idle replica is released", 90*time.Second, func() bool {
		return readyReplicas(t, base, "tiny") == 0
	})
	chat()
	second := coldStarts(t, base, "tiny")
	woke := second["t1"] - first["t1"]
	cached := second["t2"] - first["t2"]
	if woke+cached != 1 || second["t4"] != 0 || second["t3"] != first["t3"] {
		t.Fatalf("second request's acquisitions %v (first %v): want one t1 or t2", second, first)
	}

	// Unknown models are a 404 in the OpenAI shape.
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"nope","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "model_not_found") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
}

// metricValue reads the first sample of a metric whose line starts with
// prefix from /metrics.
func metricValue(t *testing.T, base, prefix string) float64 {
	t.Helper()
	return scrape(t, base)(prefix)
}

// scrape reads /metrics once and returns what reads the first sample of a
// metric whose line starts with prefix from that page (0 when none does).
func scrape(t *testing.T, base string) func(prefix string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return func(prefix string) float64 {
		for _, line := range lines {
			if strings.HasPrefix(line, prefix) {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				return v
			}
		}
		return 0
	}
}

// readyReplicas counts the ready runtimes serving model.
func readyReplicas(t testing.TB, base, model string) int {
	return runtimesIn(t, base, "ready", model)
}

// runtimesIn counts the runtimes in a state that hold model ("" for none).
func runtimesIn(t testing.TB, base, state, model string) int {
	var rts struct {
		Data []struct {
			State string `json:"state"`
			Model string `json:"model"`
		} `json:"data"`
	}
	getJSON(t, base+"/admin/runtimes", &rts)
	n := 0
	for _, r := range rts.Data {
		if r.State == state && r.Model == model {
			n++
		}
	}
	return n
}

// TestServeScalesThroughPanic steps a deployment of sim engines (target
// concurrency 8) from 1 to 40 concurrent streams: the scaler panics, at
// least 5 replicas become ready, and after the load stops and the window
// passes the deployment scales back down (to one: the predictive floor).
func TestServeScalesThroughPanic(t *testing.T) {
	if testing.Short() {
		t.Skip("scales a deployment up and down: seconds of load")
	}
	bucketDir := pushServed(t, "chat", "replicas:\n  min: 0\n  max: 6\ntarget_concurrency: 8\nwindow: 6s\nidle_delay: 1s\n")
	base := startServe(t, nil, "--data", t.TempDir(), "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
		"--warm", "1", "--slots", "6", "--sim-profile", "llama-3.1-8b-fp8-h100")
	waitUntil(t, "chat is deployed", 10*time.Second, func() bool {
		resp, err := http.Get(base + "/admin/deployments/chat")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	stream := func(ctx context.Context) error {
		body := `{"model":"chat","prompt":"hello","max_tokens":400,"ignore_eos":true,"stream":true}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// One stream, then forty, each replaced as it ends until the peak.
	errs := make(chan error, 100)
	load := func(n int) {
		for range n {
			go func() {
				for ctx.Err() == nil {
					if err := stream(ctx); err != nil && ctx.Err() == nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	load(1)
	waitUntil(t, "one replica serves", 30*time.Second, func() bool { return readyReplicas(t, base, "chat") >= 1 })
	load(39)
	panicked := false
	peak := 0
	waitUntil(t, "at least 5 ready replicas", 60*time.Second, func() bool {
		panicked = panicked || metricValue(t, base, `stoke_scaler_panic{deployment="chat"}`) == 1
		peak = max(peak, readyReplicas(t, base, "chat"))
		return peak >= 5
	})
	waitUntil(t, "the scaler reports panic mode", 10*time.Second, func() bool {
		panicked = panicked || metricValue(t, base, `stoke_scaler_panic{deployment="chat"}`) == 1
		return panicked
	})
	var dep struct {
		Status struct {
			Ready, Desired int
			Reason         string
		}
	}
	waitUntil(t, "the deployment's status shows 5 ready and desired, with the scaler's reason", 10*time.Second, func() bool {
		getJSON(t, base+"/admin/deployments/chat", &dep)
		return dep.Status.Ready >= 5 && dep.Status.Desired >= 5 && dep.Status.Reason != ""
	})
	cancel()
	select {
	case err := <-errs:
		t.Fatalf("a stream failed under load: %v", err)
	default:
	}
	// Back down after the window. The predictive floor may keep one
	// replica: the forecaster still expects the recent burst's rate.
	waitUntil(t, "the deployment scales back down", 90*time.Second, func() bool { return readyReplicas(t, base, "chat") <= 1 })
	t.Logf("peak %d ready replicas", peak)
}

// prefixHitRate sums vllm:prefix_cache_hits and _queries over the engines
// serving model and returns hits/queries.
func prefixHitRate(t *testing.T, base, model string) float64 {
	t.Helper()
	var rts struct {
		Data []struct {
			Socket string `json:"socket"`
			Model  string `json:"model"`
		} `json:"data"`
	}
	getJSON(t, base+"/admin/runtimes", &rts)
	var hits, queries float64
	for _, r := range rts.Data {
		if r.Model != model {
			continue
		}
		c := &http.Client{Transport: unixTransport(r.Socket, 0)}
		resp, err := c.Get("http://engine/metrics")
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			switch {
			case strings.HasPrefix(line, "vllm:prefix_cache_hits"):
				hits += v
			case strings.HasPrefix(line, "vllm:prefix_cache_queries"):
				queries += v
			}
		}
		resp.Body.Close()
	}
	if queries == 0 {
		t.Fatal("no prefix cache lookups on the engines")
	}
	return hits / queries
}

// TestServePrefixAffinity sends a shared-prefix workload over 4 sim
// replicas with prefix-affinity routing and with least-in-flight alone,
// and checks affinity gets the higher prefix-cache hit rate (read from the
// engines' own metrics).
func TestServePrefixAffinity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two platforms of 4 sim replicas")
	}
	bucketDir := pushServed(t, "chat", "replicas:\n  min: 4\n  max: 4\n")
	prefixes := make([]string, 16)
	for i := range prefixes {
		prefixes[i] = strings.Repeat(fmt.Sprintf("system prompt %d says: be helpful and brief. ", i), 24)
	}
	rates := map[string]float64{}
	for _, routing := range []string{"prefix", "least-inflight"} {
		base := startServe(t, nil, "--data", t.TempDir(), "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
			"--warm", "0", "--slots", "4", "--sim-profile", "llama-3.1-8b-fp8-h100", "--routing", routing)
		waitUntil(t, "4 ready replicas", 30*time.Second, func() bool { return readyReplicas(t, base, "chat") == 4 })
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		for i := range 320 {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				body, _ := json.Marshal(map[string]any{"model": "chat", "prompt": prefixes[i%len(prefixes)] + fmt.Sprintf("question %d?", i), "max_tokens": 1})
				resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("status %d", resp.StatusCode)
				}
			}()
		}
		wg.Wait()
		rates[routing] = prefixHitRate(t, base, "chat")
	}
	t.Logf("prefix-cache hit rate: prefix affinity %.3f, least in-flight %.3f", rates["prefix"], rates["least-inflight"])
	if rates["prefix"] <= rates["least-inflight"] {
		t.Fatalf("prefix affinity's hit rate %.3f is not above least in-flight's %.3f", rates["prefix"], rates["least-inflight"])
	}
}

// TestServeReplicaKilledMidStream kills the runtime serving a stream: the
// stream ends with an error event, new requests go to the other replica,
// and the killed one is replaced.
func TestServeReplicaKilledMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a replica under a stream")
	}
	bucketDir := pushServed(t, "chat", "replicas:\n  min: 2\n  max: 2\n")
	base := startServe(t, nil, "--data", t.TempDir(), "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
		"--warm", "0", "--slots", "3", "--sim-profile", "llama-3.1-8b-fp8-h100")
	waitUntil(t, "2 ready replicas", 30*time.Second, func() bool { return readyReplicas(t, base, "chat") == 2 })

	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"chat","prompt":"hello","max_tokens":100000,"ignore_eos":true,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	for i := 0; i < 3 && events.Scan(); i++ { // the stream is flowing
	}
	// Find the engine running it and SIGKILL it.
	var rts struct {
		Data []struct {
			ID, Socket string
		} `json:"data"`
	}
	getJSON(t, base+"/admin/runtimes", &rts)
	killed := ""
	for _, r := range rts.Data {
		c := &http.Client{Transport: unixTransport(r.Socket, 0)}
		var st struct {
			Running int `json:"running"`
		}
		sresp, err := c.Get("http://engine/admin/state")
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(sresp.Body).Decode(&st)
		sresp.Body.Close()
		if st.Running == 1 {
			var pid int
			fmt.Sscan(pidBySocket(r.Socket), &pid)
			if pid <= 0 {
				t.Fatalf("no pid for %s", r.Socket)
			}
			syscall.Kill(pid, syscall.SIGKILL)
			killed = r.ID
		}
	}
	if killed == "" {
		t.Fatal("no engine runs the stream")
	}
	sawError := false
	for events.Scan() {
		if strings.Contains(events.Text(), `"error"`) {
			sawError = true
		}
	}
	if !sawError {
		t.Fatal("the broken stream ended without an error event")
	}
	// New requests are served meanwhile, and the replica is replaced.
	for range 5 {
		r, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"chat","prompt":"hi","max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Fatalf("request after the kill: %d", r.StatusCode)
		}
	}
	waitUntil(t, "the killed replica is replaced", 30*time.Second, func() bool {
		getJSON(t, base+"/admin/runtimes", &rts)
		for _, r := range rts.Data {
			if r.ID == killed {
				return false
			}
		}
		return readyReplicas(t, base, "chat") == 2
	})
}

// pidBySocket finds the process whose command line names socket.
func pidBySocket(socket string) string {
	if pids := pidsNaming("unix://" + socket); len(pids) > 0 {
		return strconv.Itoa(pids[0])
	}
	return ""
}

// pidsNaming lists the processes whose command line holds s.
func pidsNaming(s string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestBenchColdStart runs `stoke bench cold-start` against stoke serve and
// checks that each tier it prepares is the tier the platform reports for
// the request it times.
func TestBenchColdStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts runtimes for every tier")
	}
	bucketDir := pushServed(t, "tiny", "replicas:\n  min: 0\n  max: 1\n")
	base := startServe(t, nil, "--data", t.TempDir(), "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
		"--warm", "1", "--slots", "2", "--kv-cache-memory", "16MiB", "--threads", "1")
	waitUntil(t, "tiny is deployed", 10*time.Second, func() bool {
		resp, err := http.Get(base + "/admin/deployments/tiny")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	out, err := stoke(t, "bench", "cold-start", "--url", base, "--model", "tiny", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep struct {
		Tiers []struct {
			Tier      string             `json:"tier"`
			Served    string             `json:"served_tier"`
			TTFT      float64            `json:"ttft_seconds"`
			Breakdown map[string]float64 `json:"breakdown"`
		} `json:"tiers"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("stoke bench cold-start:\n%s", out)
	if len(rep.Tiers) != 4 {
		t.Fatalf("%d tiers measured: %s", len(rep.Tiers), out)
	}
	for _, r := range rep.Tiers {
		if r.Served != r.Tier || r.TTFT <= 0 || len(r.Breakdown) != 5 {
			t.Errorf("tier %s: served as %s, ttft %v, breakdown %v", r.Tier, r.Served, r.TTFT, r.Breakdown)
		}
	}
	if rep.Tiers[3].Breakdown["start_seconds"] <= 0 {
		t.Errorf("t4 reports no runtime start: %v", rep.Tiers[3].Breakdown)
	}
}

// pushServed writes a synthetic tiny model with the deployment spec spec
// (stoke.yaml) and pushes it as name into a new file:// bucket, whose
// directory it returns.
func pushServed(t testing.TB, name, spec string) string {
	t.Helper()
	bucketDir := t.TempDir()
	pushTo(t, bucketDir, name, spec)
	return bucketDir
}

// pushTo pushes a synthetic tiny model with the deployment spec spec as
// name into the file:// bucket at bucketDir.
func pushTo(t testing.TB, bucketDir, name, spec string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "stoke.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := stoke(t, "push", src, "file://"+bucketDir+"/"+name); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestLateControllerIsSafeToShare sets serve's late-bound controller while
// the activator and the runtime manager already call it from their own
// goroutines (the race pass catches an unsynchronized one).
func TestLateControllerIsSafeToShare(t *testing.T) {
	var l lateController
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				l.Lookup("chat")
				l.Poke("chat")
				l.onRuntimeEvent(runtime.Event{Runtime: "rt-0-1", State: runtime.StateReady})
			}
		}()
	}
	l.set(&reconcile.Controller{})
	wg.Wait()
	if _, _, ok := l.Lookup("chat"); ok {
		t.Fatal("an empty controller resolved a model")
	}
}

// TestServeGoMaxProcs: --gomaxprocs sets the threads serve runs Go code on
// (7, which no default here is), and a negative one stops serve with one
// line.
func TestServeGoMaxProcs(t *testing.T) {
	out, err := stoke(t, "serve", "--data", t.TempDir(), "--gomaxprocs", "-1")
	if err == nil || !strings.Contains(err.Error(), "--gomaxprocs must not be negative") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("serve --gomaxprocs -1: %v\n%s", err, out)
	}
	base := startServe(t, nil, "--data", t.TempDir(), "--warm", "0", "--sim-profile", "llama-3.1-8b-fp8-h100", "--gomaxprocs", "7")
	if got := metricValue(t, base, "go_sched_gomaxprocs_threads "); got != 7 {
		t.Fatalf("go_sched_gomaxprocs_threads is %v under --gomaxprocs 7", got)
	}
}

// unixTransport is an HTTP transport whose every connection goes to the
// unix socket at path, keeping idle connections per host (0: net/http's
// default).
func unixTransport(path string, idle int) *http.Transport {
	return &http.Transport{MaxIdleConnsPerHost: idle, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}
}
