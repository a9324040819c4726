// Package kubetest starts a real Kubernetes control plane for tests: etcd
// (Debian's etcd-server), kube-apiserver, kube-controller-manager and
// kube-scheduler (v1.37.2, built from the Go module proxy by
// scripts/install-kubernetes.sh, which `make deps` runs), and optionally a
// kubelet on a private containerd with CRI and CNI (Debian's containerd
// and containernetworking-plugins), so that pods really run. Everything
// lives under the test's temporary directory, on free loopback ports, and
// stops when the test ends.
//
// Without the binaries, or without root for the kubelet, the test is
// skipped with the reason, unless STOKE_REQUIRE_KUBERNETES=1 (which .ci/run
// sets) makes that a failure.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/stokehq/stoke/internal/gobin"
	"github.com/stokehq/stoke/internal/syncbuf"
)

// Options say what Start starts.
type Options struct {
	// Kubelet adds a node: a kubelet on a private containerd, so pods run.
	Kubelet bool
}

// Cluster is a running control plane.
type Cluster struct {
	// Config reaches the API server as cluster admin.
	Config *rest.Config
	// Client is a clientset on Config.
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file for Config.
	Kubeconfig string
	// Node is the kubelet's node name ("" without Options.Kubelet).
	Node string
	// Containerd is the socket of the kubelet's containerd, where a test
	// imports the images its pods run (namespace "k8s.io").
	Containerd string

	dir    string
	procs  []*proc
	bridge string // the node's CNI bridge
	runc   string
}

// startTimeout bounds how long one component may take to come up.
const startTimeout = 90 * time.Second

// Start starts a control plane (and, with o.Kubelet, a node) and stops it
// when the test ends.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	bins := map[string]string{}
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		p, err := gobin.Find(name)
		if err != nil {
			skip(t, "%v (run scripts/install-kubernetes.sh, which `make deps` runs)", err)
		}
		bins[name] = p
	}
	dir := shortTempDir(t)
	c := &Cluster{dir: dir}
	t.Cleanup(c.stop)
	ports := freePorts(t, 6)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	c.run(t, "etcd", bins["etcd"], "--name", "default", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn")
	waitHTTP(t, c, etcdURL+"/health", nil)

	token := randomHex(t, 16)
	must(t, os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+",admin,admin,system:masters\n"), 0o600))
	saKey := filepath.Join(dir, "sa.key")
	saPub := filepath.Join(dir, "sa.pub")
	writeServiceAccountKeys(t, saKey, saPub)
	apiPort := ports[2]
	host := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	c.run(t, "kube-apiserver", bins["kube-apiserver"],
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(apiPort), "--cert-dir", filepath.Join(dir, "apiserver"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", saPub,
		"--service-account-signing-key-file", saKey, "--service-cluster-ip-range", "10.96.0.0/16",
		"--endpoint-reconciler-type", "none", "--enable-priority-and-fairness=false", "--profiling=false")
	c.Config = &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 100, Burst: 200}
	waitHTTP(t, c, host+"/readyz", c.Config)
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	must(t, os.WriteFile(c.Kubeconfig, []byte(kubeconfig(host, token)), 0o600))
	client, err := kubernetes.NewForConfig(c.Config)
	must(t, err)
	c.Client = client

	c.run(t, "kube-controller-manager", bins["kube-controller-manager"], "--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--service-account-private-key-file", saKey, "--leader-elect=false", "--use-service-account-credentials=false",
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(ports[3]),
		"--controllers", "*,-csrsigning,-nodeipam",
		"--concurrent-gc-syncs", "2", "--profiling=false")
	c.run(t, "kube-scheduler", bins["kube-scheduler"], "--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(ports[4]), "--profiling=false")
	waitServiceAccount(t, c, "default")
	if o.Kubelet {
		c.startNode(t, ports[5])
	}
	return c
}

// Namespace creates a namespace for the test, waiting until its default
// service account exists (pods need it), and returns its name.
func (c *Cluster) Namespace(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	waitServiceAccount(t, c, name)
	return name
}

// proc is a component process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	out    *syncbuf.Buffer
	exited chan error
}

// run starts a component, its output kept for when the test fails.
func (c *Cluster) run(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), out: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Dir = c.dir
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	c.procs = append(c.procs, p)
	return p
}

// stop stops the components, last started first; a node's pods go first,
// so that the kubelet tears down their sandboxes and networks.
func (c *Cluster) stop() {
	if c.Node != "" {
		c.drainNode()
	}
	defer c.cleanupNode()
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
	}
	c.procs = nil
}

// Logs is the output of every component so far, for a failing test.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, p := range c.procs {
		fmt.Fprintf(&b, "=== %s\n%s\n", p.name, tail(p.out.String(), 8000))
	}
	return b.String()
}

// exitedEarly fails the test when a component has exited.
func (c *Cluster) exitedEarly(t testing.TB) {
	t.Helper()
	for _, p := range c.procs {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("%s exited: %v\n%s", p.name, err, c.Logs())
		default:
		}
	}
}

// waitHTTP polls url until it answers 200, failing the test with the
// components' logs when it does not within startTimeout.
func waitHTTP(t testing.TB, c *Cluster, url string, cfg *rest.Config) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	if cfg != nil {
		tr, err := rest.TransportFor(cfg)
		must(t, err)
		client.Transport = tr
	}
	deadline := time.Now().Add(startTimeout)
	var last string
	for time.Now().Before(deadline) {
		c.exitedEarly(t)
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 in %v (last: %s)\n%s", url, startTimeout, last, c.Logs())
}

// waitServiceAccount waits until the controller manager has created the
// default service account of namespace ns.
func waitServiceAccount(t testing.TB, c *Cluster, ns string) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		c.exitedEarly(t)
		if _, err := c.Client.CoreV1().ServiceAccounts(ns).Get(context.Background(), "default", metav1.GetOptions{}); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("namespace %s has no default service account after %v\n%s", ns, startTimeout, c.Logs())
}

// skip skips the test, or fails it under STOKE_REQUIRE_KUBERNETES=1.
func skip(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("STOKE_REQUIRE_KUBERNETES") == "1" {
		t.Fatalf(format+" (STOKE_REQUIRE_KUBERNETES=1)", args...)
	}
	t.Skipf(format, args...)
}

// shortTempDir is a temporary directory with a short path, since unix
// socket paths are bounded (108 bytes); it is removed when the test ends.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kt")
	must(t, err)
	t.Cleanup(func() {
		// Mounts a kubelet left behind must not take the host's files.
		unmountUnder(dir)
		os.RemoveAll(dir)
	})
	return dir
}

// freePorts returns n distinct loopback ports that were free just now.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		must(t, err)
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// writeServiceAccountKeys writes an RSA key pair for service account
// tokens.
func writeServiceAccountKeys(t testing.TB, keyPath, pubPath string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	must(t, err)
	must(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600))
	must(t, os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644))
}

// kubeconfig is a kubeconfig file's text for host and token.
func kubeconfig(host, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: admin
current-context: test
`, host, token)
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	must(t, err)
	return hex.EncodeToString(b)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
