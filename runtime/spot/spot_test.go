package spot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stokehq/stoke/internal/syncbuf"
	"github.com/stokehq/stoke/runtime/spot/spottest"
)

// wait is how long a test waits for an event before it fails: generous,
// since nothing here asserts how long anything takes.
const wait = 30 * time.Second

func TestParseNotice(t *testing.T) {
	at := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	cases := []struct {
		name, raw string
		want      Notice
		err       string
	}{
		{"terminate", `{"action":"terminate","time":"2026-01-02T15:04:05Z"}`, Notice{Action: ActionTerminate, Time: at}, ""},
		{"stop, indented as the mock writes it", "{\n\t\"action\": \"stop\",\n\t\"time\": \"2026-01-02T15:04:05Z\"\n}", Notice{Action: ActionStop, Time: at}, ""},
		{"hibernate without a time", `{"action":"hibernate"}`, Notice{Action: ActionHibernate}, ""},
		{"a time that does not parse", `{"action":"terminate","time":"soon"}`, Notice{Action: ActionTerminate}, ""},
		{"an action unknown today", `{"action":"reboot","time":"2026-01-02T15:04:05Z"}`, Notice{Action: "reboot", Time: at}, ""},
		{"no action", `{"time":"2026-01-02T15:04:05Z"}`, Notice{}, "no action"},
		{"not JSON", `<html>404</html>`, Notice{}, "parse spot notice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNotice([]byte(tc.raw))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseNotice = %+v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got.Action != tc.want.Action || !got.Time.Equal(tc.want.Time) {
				t.Fatalf("ParseNotice = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestNewRefusesBadEndpoints(t *testing.T) {
	for _, ep := range []string{"127.0.0.1:1338", "ftp://host", "http://", "::"} {
		if _, err := New(Options{Endpoint: ep}); err == nil {
			t.Errorf("endpoint %q accepted", ep)
		}
	}
	for _, ep := range []string{"", "http://127.0.0.1:1338", "http://[fd00:ec2::254]"} {
		if _, err := New(Options{Endpoint: ep}); err != nil {
			t.Errorf("endpoint %q: %v", ep, err)
		}
	}
}

// fakeIMDS is an IMDSv2 server whose spot/instance-action answers follow
// a script, one step a read (the last one repeating), and that refuses
// reads without a session token.
type fakeIMDS struct {
	mu     sync.Mutex
	script []string // "" is a 404
	reads  int
}

func (f *fakeIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
		w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", r.Header.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds"))
		fmt.Fprint(w, "token")
	case r.Header.Get("X-Aws-Ec2-Metadata-Token") != "token":
		http.Error(w, "no token", http.StatusUnauthorized)
	case r.Method == http.MethodGet && r.URL.Path == "/latest/meta-data/"+Path:
		f.mu.Lock()
		body := f.script[min(f.reads, len(f.script)-1)]
		f.reads++
		f.mu.Unlock()
		if body == "" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeIMDS) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// TestWatcherReportsEachNoticeOnce: a notice is reported once however many
// polls see it, its time moving does not make it new, and a notice with
// another action, or one posted again after it was withdrawn, is new.
func TestWatcherReportsEachNoticeOnce(t *testing.T) {
	fake := &fakeIMDS{script: []string{
		"",
		`{"action":"terminate","time":"2026-01-02T15:04:05Z"}`,
		`{"action":"terminate","time":"2026-01-02T15:04:06Z"}`,
		`{"action":"terminate","time":"2026-01-02T15:04:07Z"}`,
		`{"action":"stop","time":"2026-01-02T15:04:07Z"}`,
		`{"action":"stop","time":"2026-01-02T15:04:07Z"}`,
		"",
		`{"action":"stop","time":"2026-01-02T15:09:00Z"}`,
		"",
	}}
	ts := httptest.NewServer(fake)
	defer ts.Close()
	var mu sync.Mutex
	var got []string
	w, err := New(Options{Endpoint: ts.URL, Interval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		OnNotice: func(_ context.Context, n Notice) {
			mu.Lock()
			got = append(got, n.Action+"@"+n.Time.Format(time.TimeOnly))
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := runWatcher(ctx, w)
	waitUntil(t, "the script read to its end", func() bool { return fake.readCount() > len(fake.script)+2 })
	cancel()
	waitDone(t, done)
	want := []string{"terminate@15:04:05", "stop@15:04:07", "stop@15:09:00"}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("notices %v, want %v", got, want)
	}
	if n := counter(t, w.notices.WithLabelValues(ActionStop)); n != 2 {
		t.Errorf("stoke_spot_interruption_notices_total{action=stop} = %v, want 2", n)
	}
	if n := counter(t, w.notices.WithLabelValues(ActionTerminate)); n != 1 {
		t.Errorf("stoke_spot_interruption_notices_total{action=terminate} = %v, want 1", n)
	}
}

// TestWatcherSurvivesUnreachableIMDS polls an endpoint where nothing
// listens: every poll fails, the failure is logged once (not once a
// poll), Run keeps polling and returns nil when its context ends.
func TestWatcherSurvivesUnreachableIMDS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + l.Addr().String()
	l.Close() // nothing listens there now
	var logs syncbuf.Buffer
	w, err := New(Options{Endpoint: endpoint, Interval: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		OnNotice: func(context.Context, Notice) { t.Error("a notice from an endpoint that does not answer") }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := runWatcher(ctx, w)
	waitUntil(t, "three failed polls", func() bool { return counter(t, w.polls.WithLabelValues("error")) >= 3 })
	cancel()
	waitDone(t, done)
	if n := strings.Count(logs.String(), "cannot read spot interruption notices"); n != 1 {
		t.Errorf("%d log lines about the failing endpoint over %v failed polls, want 1:\n%s", n, counter(t, w.polls.WithLabelValues("error")), logs.String())
	}
	if !strings.Contains(logs.String(), endpoint) {
		t.Errorf("the log does not name the endpoint %s:\n%s", endpoint, logs.String())
	}
}

// TestWatcherWithMetadataMock runs AWS's amazon-ec2-metadata-mock in
// IMDSv2-only mode with a spot notice delayed a few seconds: polls see
// none until then, and then exactly one notice, of the terminate action,
// due about two minutes on (the mock's default).
func TestWatcherWithMetadataMock(t *testing.T) {
	const delay = 4 * time.Second
	launched := time.Now()
	endpoint := startMetadataMock(t, "spot", "--action", "terminate", "-d", strconv.Itoa(int(delay/time.Second)))
	notices := make(chan Notice, 10)
	w, err := New(Options{Endpoint: endpoint, Interval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		OnNotice: func(_ context.Context, n Notice) { notices <- n }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	n, ok, err := w.Check(ctx)
	switch {
	case err != nil:
		t.Fatalf("first check: %v", err)
	case ok && time.Since(launched) < delay:
		t.Fatalf("a notice %+v before the mock's delay", n)
	case ok:
		t.Logf("this machine was too slow to poll within the mock's %v delay; not checking that no notice came first", delay)
	}

	done := runWatcher(ctx, w)
	select {
	case n = <-notices:
	case <-time.After(wait):
		t.Fatal("no notice from the metadata mock")
	}
	if n.Action != ActionTerminate {
		t.Errorf("notice %+v, want action terminate", n)
	}
	if n.Time.Before(launched.Add(-time.Minute)) || n.Time.After(time.Now().Add(10*time.Minute)) {
		t.Errorf("notice time %v, want one in the next few minutes", n.Time)
	}
	if got := counter(t, w.polls.WithLabelValues("none")); !ok && got < 1 {
		t.Errorf("no poll saw the absence of a notice before it (polls with none: %v)", got)
	}
	// More polls see the notice still posted: none is reported again.
	seen := counter(t, w.polls.WithLabelValues("notice"))
	waitUntil(t, "three more polls of the posted notice", func() bool { return counter(t, w.polls.WithLabelValues("notice")) >= seen+3 })
	cancel()
	waitDone(t, done)
	select {
	case again := <-notices:
		t.Errorf("the posted notice was reported again: %+v", again)
	default:
	}
	if got := counter(t, w.notices.WithLabelValues(ActionTerminate)); got != 1 {
		t.Errorf("stoke_spot_interruption_notices_total{action=terminate} = %v, want 1", got)
	}
}

// startMetadataMock starts ec2-metadata-mock with args on a free loopback
// port, IMDSv2 only, waits until it hands out session tokens and stops it
// when the test ends; it returns its endpoint. Without the binary the test
// is skipped.
func startMetadataMock(t *testing.T, args ...string) string {
	t.Helper()
	bin := spottest.Binary(t)
	var lastErr error
	for range 3 { // a port found free may be taken before the mock binds it
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		home := t.TempDir() // where it looks for its config file
		cmd := exec.Command(bin, append(args, "-n", "127.0.0.1", "-p", port, "-I")...)
		cmd.Dir, cmd.Env = home, append(os.Environ(), "HOME="+home)
		var out syncbuf.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("run %s: %v", bin, err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		stop := func() {
			cmd.Process.Kill()
			<-exited
		}
		endpoint := "http://127.0.0.1:" + port
		if lastErr = waitMockReady(endpoint, exited); lastErr == nil {
			t.Cleanup(stop)
			return endpoint
		}
		stop()
		lastErr = fmt.Errorf("%w; its output:\n%s", lastErr, out.String())
	}
	t.Fatalf("start ec2-metadata-mock: %v", lastErr)
	return ""
}

// waitMockReady waits until the mock at endpoint hands out an IMDSv2
// session token.
func waitMockReady(endpoint string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, endpoint+"/latest/api/token", nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "60")
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("it exited before it served")
		case <-ctx.Done():
			return fmt.Errorf("no session token from %s within %v", endpoint, wait)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// runWatcher runs w until ctx ends; the channel gets Run's result.
func runWatcher(ctx context.Context, w *Watcher) <-chan error {
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return done
}

// waitDone waits for Run to return after its context ended.
func waitDone(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return after its context ended")
	}
}

// waitUntil polls cond until it holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// counter reads a counter's value.
func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
