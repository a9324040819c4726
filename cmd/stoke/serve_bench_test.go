package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/api"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/synth"
)

// loadResult is one open-loop run: latencies of the requests that
// succeeded and the count of those that did not.
type loadResult struct {
	lat    []time.Duration
	errors int64
}

// merge adds another run's latencies and errors to r.
func (r *loadResult) merge(o loadResult) {
	r.lat = append(r.lat, o.lat...)
	r.errors += o.errors
}

func (r loadResult) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// openLoop sends rate requests a second for d (each to url, with a body
// chosen by i), whatever the answers, and times each.
func openLoop(client *http.Client, url string, body func(i int) string, rate int, d time.Duration) loadResult {
	return openLoopFunc(rate, d, func(i int) (time.Duration, error) {
		t := time.Now()
		resp, err := client.Post(url, "application/json", strings.NewReader(body(i)))
		if err == nil {
			_, err = io_Discard(resp)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		return time.Since(t), err
	})
}

// openLoopFunc calls do rate times a second for d, whatever it returns,
// each call on its own goroutine, and collects the latencies of the calls
// that succeeded and the count of those that did not.
func openLoopFunc(rate int, d time.Duration, do func(i int) (time.Duration, error)) loadResult {
	var mu sync.Mutex
	var res loadResult
	var errs atomic.Int64
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, err := do(i)
			if err != nil {
				errs.Add(1)
				return
			}
			mu.Lock()
			res.lat = append(res.lat, lat)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.errors = errs.Load()
	return res
}

// benchSeconds is $STOKE_BENCH_SECONDS (a benchmark phase's length in
// seconds), else def seconds.
func benchSeconds(b *testing.B, def int) time.Duration {
	if s := os.Getenv("STOKE_BENCH_SECONDS"); s != "" {
		d, err := time.ParseDuration(s + "s")
		if err != nil {
			b.Fatalf("$STOKE_BENCH_SECONDS: %v", err)
		}
		return d
	}
	return time.Duration(def) * time.Second
}

// io_Discard drains and closes a response body.
func io_Discard(resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	var n int64
	buf := make([]byte, 4096)
	for {
		m, err := resp.Body.Read(buf)
		n += int64(m)
		if err != nil {
			if err.Error() == "EOF" {
				return n, nil
			}
			return n, err
		}
	}
}

// benchServe pushes models (each served by one sim replica, always on) and
// starts stoke serve on sim engines.
func benchServe(b *testing.B, models ...string) string {
	return benchServeWith(b, nil, models...)
}

// benchServeWith is benchServe with more serve flags.
func benchServeWith(b *testing.B, flags []string, models ...string) string {
	src := filepath.Join(b.TempDir(), "src")
	if err := synth.Write(context.Background(), src, synth.Options{Preset: "tiny", DType: dtype.F32, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "stoke.yaml"), []byte("replicas:\n  min: 1\n  max: 1\nbuffer:\n  capacity: 10000\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	bucketDir := b.TempDir()
	for _, m := range models {
		if out, err := stoke(b, "push", src, "file://"+bucketDir+"/"+m); err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
	}
	args := []string{"--data", b.TempDir(), "--bucket", "file://" + bucketDir, "--watch-interval", "100ms",
		"--warm", "0", "--slots", fmt.Sprint(len(models)), "--sim-profile", "llama-3.1-8b-fp8-h100"}
	base := startServe(b, nil, append(args, flags...)...)
	for _, m := range models {
		waitUntil(b, m+" has a ready replica", 30*time.Second, func() bool { return readyReplicas(b, base, m) == 1 })
	}
	return base
}

// BenchmarkServeOverhead measures the latency stoke serve adds to a
// one-token completion on a sim engine (8B H100 profile), against the same
// engine called directly, at 200 and 1,000 requests/s ($STOKE_BENCH_SECONDS
// each, default 5), with serve on Go's default GOMAXPROCS and on
// --gomaxprocs 1.
func BenchmarkServeOverhead(b *testing.B) {
	seconds := benchSeconds(b, 5)
	for _, procs := range []int{0, 1} {
		b.Run(fmt.Sprintf("gomaxprocs=%d", procs), func(b *testing.B) {
			benchServeOverhead(b, seconds, benchServeWith(b, []string{"--gomaxprocs", fmt.Sprint(procs)}, "chat"))
		})
	}
}

// benchServeOverhead is BenchmarkServeOverhead against the serve at base.
func benchServeOverhead(b *testing.B, seconds time.Duration, base string) {
	var rts struct {
		Data []struct {
			Socket string `json:"socket"`
		} `json:"data"`
	}
	getJSON(b, base+"/admin/runtimes", &rts)
	direct := &http.Client{Transport: unixTransport(rts.Data[0].Socket, 2048)}
	viaServe := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048}}
	body := func(int) string { return `{"model":"chat","prompt":"hello there","max_tokens":1}` }
	for range b.N {
		for _, rate := range []int{200, 1000} {
			d := openLoop(direct, "http://engine/v1/completions", body, rate, seconds)
			s := openLoop(viaServe, base+"/v1/completions", body, rate, seconds)
			b.Logf("%d req/s: engine p50 %.2f ms p99 %.2f ms (%d errors); via serve p50 %.2f ms p99 %.2f ms (%d errors); added p50 %.2f ms p99 %.2f ms",
				rate, ms(d.pct(0.5)), ms(d.pct(0.99)), d.errors, ms(s.pct(0.5)), ms(s.pct(0.99)), s.errors,
				ms(s.pct(0.5)-d.pct(0.5)), ms(s.pct(0.99)-d.pct(0.99)))
			b.ReportMetric(ms(s.pct(0.5)-d.pct(0.5)), fmt.Sprintf("added_p50_ms@%d", rate))
			b.ReportMetric(ms(s.pct(0.99)-d.pct(0.99)), fmt.Sprintf("added_p99_ms@%d", rate))
		}
	}
}

// BenchmarkServeThreeModels raises the rate of one-token completions
// spread over 3 models on sim engines and reports the highest rate served
// with no errors.
func BenchmarkServeThreeModels(b *testing.B) {
	base := benchServe(b, "m1", "m2", "m3")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096}}
	body := func(i int) string { return fmt.Sprintf(`{"model":"m%d","prompt":"hello there","max_tokens":1}`, i%3+1) }
	for range b.N {
		best := 0
		for _, rate := range []int{1000, 2000, 3000, 4000, 6000} {
			r := openLoop(client, base+"/v1/completions", body, rate, 5*time.Second)
			b.Logf("%d req/s over 3 models: %d ok, %d errors, p50 %.2f ms, p99 %.2f ms", rate, len(r.lat), r.errors, ms(r.pct(0.5)), ms(r.pct(0.99)))
			if r.errors > 0 {
				break
			}
			best = rate
		}
		b.ReportMetric(float64(best), "max_req/s_no_errors")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// The gateway's CPU per request.
//
// BenchmarkServeCPU runs the data path of stoke serve (the api handler and
// the activator, over real TCP and a real unix socket) in this process and
// everything else in others: the engine is a sim engine (`stoke engine
// --sim`, 8B H100 profile) in a child process, and the clients are a load
// generator in another child (this test binary, TestServeCPULoadgen). So
// the getrusage of this process around a run is the gateway's CPU alone,
// and `-cpuprofile` profiles the gateway alone. Each run sends b.N requests
// open loop at $STOKE_BENCH_RATE requests/s (default 500, as the issue
// measured); use -benchtime 2500x for 5 s runs. It reports cpu-us/req and
// checks that every answer was whole and that stoke_tokens_total counted
// exactly the completion tokens the clients were sent.
//
// The reverseproxy sub-benchmarks are the floor to compare serve with:
// the same requests through a bare httputil.ReverseProxy in this process
// to the same engine (no api, no activator, no metrics), which is what Go's
// net/http alone costs a request on this machine.
func BenchmarkServeCPU(b *testing.B) {
	rate := 500
	if s := os.Getenv("STOKE_BENCH_RATE"); s != "" {
		if _, err := fmt.Sscan(s, &rate); err != nil || rate <= 0 {
			b.Fatalf("STOKE_BENCH_RATE=%q", s)
		}
	}
	sock := startSimEngine(b)
	reg := prometheus.NewRegistry()
	act := activator.New(activator.Options{Resolver: benchResolver{}, Registerer: reg})
	act.AddReplica("chat", "sim-0", "unix://"+sock, 256)
	serveURL := benchHTTPServer(b, api.New(api.Options{Inference: act, Registry: reg})) + "/v1/completions"
	floor := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(&url.URL{Scheme: "http", Host: "engine"}) },
		Transport: unixTransport(sock, 256),
	}
	// Full duplex: a stream's headers can reach the client before the
	// Transport has read the request body to its end, and net/http closes
	// an unread request body once the response has begun, which would
	// abort that request.
	floorURL := benchHTTPServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		floor.ServeHTTP(w, r)
	})) + "/v1/completions"
	lg := startLoadgen(b)
	// sent counts the completion tokens the clients were sent; a request's
	// metrics are recorded just after its client has the whole answer, so
	// settle waits until the counter caught up.
	sent := 0
	settle := func(b *testing.B) {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			got := counterSum(b, reg, "stoke_tokens_total", "completion")
			if got == float64(sent) {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("stoke_tokens_total{kind=completion} is %v, the answers' usage says %d", got, sent)
			}
		}
	}

	for _, gw := range []struct {
		name, url string
		counted   bool // it records stoke_tokens_total
	}{{"serve", serveURL, true}, {"reverseproxy", floorURL, false}} {
		for _, tc := range []struct {
			name, body string
			stream     bool
		}{
			{"one-token", `{"model":"chat","prompt":"hello there","max_tokens":1}`, false},
			{"stream-16", `{"model":"chat","prompt":"hello there","max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}`, true},
		} {
			b.Run(gw.name+"/"+tc.name, func(b *testing.B) {
				b.ReportAllocs() // this process's: the gateway's
				cmd := loadCmd{URL: gw.url, N: 20, Rate: rate, Body: tc.body, Stream: tc.stream}
				// Warm the connections up.
				warm := lg.run(b, cmd)
				if gw.counted {
					sent += warm.CompletionTokens
					settle(b)
				}
				runtime.GC()
				b.ResetTimer()
				cpu0 := cpuTime(b)
				cmd.N = b.N
				res := lg.run(b, cmd)
				if res.Errors > 0 {
					b.Fatalf("%d of %d requests failed, the first: %s", res.Errors, b.N, res.FirstError)
				}
				if gw.counted {
					sent += res.CompletionTokens
					settle(b)
				}
				cpu := cpuTime(b) - cpu0
				b.StopTimer()
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/req")
			})
		}
	}
}

// benchHTTPServer serves h on a loopback TCP port until the benchmark
// ends and returns its base URL.
func benchHTTPServer(b *testing.B, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	b.Cleanup(func() { hs.Close() })
	return "http://" + ln.Addr().String()
}

// benchResolver knows one model, "chat", with room to buffer everything.
type benchResolver struct{}

func (benchResolver) Lookup(name string) (string, config.Spec, bool) {
	spec := config.Default()
	spec.Buffer.Capacity = 100000
	return "sha256:bench", spec, name == "chat"
}
func (benchResolver) Poke(string) {}

// cpuTime is the user and system CPU this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// counterSum adds the values of a counter's series that have a label
// valued value.
func counterSum(b *testing.B, reg *prometheus.Registry, name, value string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// startSimEngine starts `stoke engine --sim` on a unix socket in a child
// process and returns the socket's path once it serves.
func startSimEngine(b *testing.B) string {
	dir, err := os.MkdirTemp("", "stoke-bench") // short: socket paths are limited
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "engine.sock")
	cmd := exec.Command(os.Args[0], "engine", "--sim", "--sim-profile", "llama-3.1-8b-fp8-h100", "--served-model-name", "chat",
		"--listen", "unix://"+sock)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	client := &http.Client{Transport: unixTransport(sock, 0)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("http://engine/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return sock
			}
		}
		select {
		case <-exited:
			b.Fatalf("the sim engine exited:\n%s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("the sim engine did not serve in 30s:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// loadCmd asks the load generator for N requests to URL at Rate a second.
type loadCmd struct {
	URL     string
	N, Rate int
	Body    string
	Stream  bool
}

// loadRun is what the load generator answers a loadCmd with.
type loadRun struct {
	Errors           int
	FirstError       string
	CompletionTokens int
}

// loadgen is a load generator in a child process (TestServeCPULoadgen),
// driven by one JSON line per run on its stdin.
type loadgen struct {
	in  io.Writer
	out *json.Decoder
}

// loadgenEnv set to 1 makes TestServeCPULoadgen the load generator.
const loadgenEnv = "STOKE_BENCH_LOADGEN"

func startLoadgen(b *testing.B) *loadgen {
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeCPULoadgen$", "-test.count=1")
	cmd.Env = append(os.Environ(), loadgenEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { in.Close(); cmd.Wait() })
	return &loadgen{in: in, out: json.NewDecoder(out)}
}

func (l *loadgen) run(b *testing.B, c loadCmd) loadRun {
	if err := json.NewEncoder(l.in).Encode(c); err != nil {
		b.Fatal(err)
	}
	var r loadRun
	if err := l.out.Decode(&r); err != nil {
		b.Fatalf("load generator: %v", err)
	}
	return r
}

// TestServeCPULoadgen is BenchmarkServeCPU's load generator, not a test:
// it runs only in the child process the benchmark starts, sending each
// loadCmd read from stdin open loop and answering with a loadRun.
func TestServeCPULoadgen(t *testing.T) {
	if os.Getenv(loadgenEnv) != "1" {
		t.Skip("BenchmarkServeCPU's load generator; runs only in its child process")
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true}}
	in := json.NewDecoder(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for {
		var c loadCmd
		if err := in.Decode(&c); err != nil {
			return // the benchmark closed stdin
		}
		var mu sync.Mutex
		var res loadRun
		fail := func(err error) {
			mu.Lock()
			if res.Errors == 0 {
				res.FirstError = err.Error()
			}
			res.Errors++
			mu.Unlock()
		}
		var wg sync.WaitGroup
		interval := time.Second / time.Duration(c.Rate)
		start := time.Now()
		for i := range c.N {
			if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
				time.Sleep(wait)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := client.Post(c.URL, "application/json", strings.NewReader(c.Body))
				if err != nil {
					fail(err)
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					fail(err)
					return
				}
				if resp.StatusCode != http.StatusOK {
					fail(fmt.Errorf("status %d: %s", resp.StatusCode, body))
					return
				}
				n, err := completionTokens(body, c.Stream)
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				res.CompletionTokens += n
				mu.Unlock()
			}()
		}
		wg.Wait()
		if err := out.Encode(res); err != nil {
			return
		}
	}
}

// completionTokens reads the usage of a whole answer: the body of a plain
// one, the usage event of a stream (which must end with [DONE]).
func completionTokens(body []byte, stream bool) (int, error) {
	var v struct {
		Usage *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if !stream {
		if err := json.Unmarshal(body, &v); err != nil || v.Usage == nil {
			return 0, fmt.Errorf("answer without usage: %.200s", body)
		}
		return v.Usage.CompletionTokens, nil
	}
	events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	if events[len(events)-1] != "data: [DONE]" {
		return 0, fmt.Errorf("stream does not end with [DONE]: %.200s", body[max(0, len(body)-200):])
	}
	for _, e := range events {
		if json.Unmarshal([]byte(strings.TrimPrefix(e, "data: ")), &v) == nil && v.Usage != nil {
			return v.Usage.CompletionTokens, nil
		}
	}
	return 0, fmt.Errorf("stream without a usage event: %.200s", body)
}
