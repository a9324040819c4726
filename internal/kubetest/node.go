package kubetest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stokehq/stoke/images"
	"github.com/stokehq/stoke/internal/gobin"
)

// NodeName is the kubelet's node name.
const NodeName = "stoke-node"

// SandboxImage is the reference of the sandbox (pause) image on the
// node, which also serves tests as an image that only waits.
const SandboxImage = "stoke.local/kubetest-pause/stoke:dev"

// criNamespace is the containerd namespace the CRI plugin keeps images in.
const criNamespace = "k8s.io"

// cniDirs are where Debian's containernetworking-plugins may be.
var cniDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// startNode starts a private containerd with CRI and CNI, imports the
// sandbox image into it, and a kubelet registering node NodeName, and
// waits until the node is Ready.
func (c *Cluster) startNode(t testing.TB, kubeletPort int) {
	t.Helper()
	if os.Geteuid() != 0 {
		skip(t, "a kubelet needs root; running as uid %d", os.Geteuid())
	}
	kubelet, err := gobin.Find("kubelet")
	if err != nil {
		skip(t, "%v (run scripts/install-kubernetes.sh)", err)
	}
	ctrd, err := exec.LookPath("containerd")
	if err != nil {
		skip(t, "containerd is not installed (scripts/install-containerd.sh): %v", err)
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		skip(t, "runc is not installed (scripts/install-containerd.sh): %v", err)
	}
	cniBin := ""
	for _, d := range cniDirs {
		if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
			cniBin = d
			break
		}
	}
	if cniBin == "" {
		skip(t, "no CNI plugins in %s (Debian's containernetworking-plugins; scripts/install-kubernetes.sh)", strings.Join(cniDirs, ", "))
	}
	dir := c.dir
	socket := filepath.Join(dir, "ctrd.sock")
	suffix := randomHex(t, 3)
	bridge := "kt" + suffix
	c.bridge, c.runc = bridge, runc
	cniConf := filepath.Join(dir, "cni")
	must(t, os.MkdirAll(cniConf, 0o755))
	must(t, os.WriteFile(filepath.Join(cniConf, "10-bridge.conflist"), []byte(cniConfig(bridge, subnet(suffix), filepath.Join(dir, "ipam"))), 0o644))

	pauseRef := buildPause(t, filepath.Join(dir, "images"))
	must(t, os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(containerdConfig(dir, socket, pauseRef.ref, runc, cniBin, cniConf)), 0o644))
	c.run(t, "containerd", ctrd, "--config", filepath.Join(dir, "containerd.toml"))
	waitContainerd(t, c, socket)
	if _, err := images.ImportArchive(context.Background(), pauseRef.archive, images.ImportOptions{Socket: socket, Namespace: criNamespace, Snapshotters: []string{"overlayfs"}}); err != nil {
		t.Fatalf("import the sandbox image: %v", err)
	}
	c.Containerd = socket

	config := filepath.Join(dir, "kubelet.yaml")
	must(t, os.WriteFile(config, []byte(kubeletConfig(kubeletPort, socket, filepath.Join(dir, "pod-logs"))), 0o644))
	c.run(t, "kubelet", kubelet, "--config", config, "--kubeconfig", c.Kubeconfig, "--root-dir", filepath.Join(dir, "kubelet"),
		"--cert-dir", filepath.Join(dir, "kubelet-pki"), "--hostname-override", NodeName, "--node-ip", "127.0.0.1", "--v", "1")
	c.Node = NodeName
	waitNodeReady(t, c)
}

// ImportImage imports an OCI image archive into the node's containerd, for
// pods with imagePullPolicy Never.
func (c *Cluster) ImportImage(t testing.TB, archive string) {
	t.Helper()
	if c.Containerd == "" {
		t.Fatal("import image: the cluster has no node (Options.Kubelet)")
	}
	if _, err := images.ImportArchive(context.Background(), archive, images.ImportOptions{Socket: c.Containerd, Namespace: criNamespace, Snapshotters: []string{"overlayfs"}}); err != nil {
		t.Fatalf("import %s: %v", archive, err)
	}
}

// builtImage is an image archive and its reference.
type builtImage struct{ archive, ref string }

// buildPause builds the sandbox image from command pause (this package's
// pause directory) with package images.
func buildPause(t testing.TB, out string) builtImage {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("find the kubetest package's source")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := images.Build(ctx, images.Options{Source: root, Package: "./internal/kubetest/pause", Out: out, Repository: "stoke.local/kubetest-pause"})
	if err != nil {
		t.Fatalf("build the sandbox image: %v", err)
	}
	return builtImage{archive: res.Archives[images.StokeImage], ref: res.Refs[images.StokeImage]}
}

// waitContainerd waits until containerd answers on socket.
func waitContainerd(t testing.TB, c *Cluster, socket string) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		c.exitedEarly(t)
		if _, err := os.Stat(socket); err == nil {
			client, err := containerd.New(socket, containerd.WithTimeout(2*time.Second))
			if err == nil {
				ok, err := client.IsServing(context.Background())
				client.Close()
				if err == nil && ok {
					return
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("containerd at %s did not serve in %v\n%s", socket, startTimeout, c.Logs())
}

// waitNodeReady waits until the kubelet's node reports Ready.
func waitNodeReady(t testing.TB, c *Cluster) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		c.exitedEarly(t)
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), NodeName, metav1.GetOptions{})
		if err == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("node %s is not Ready after %v\n%s", NodeName, startTimeout, c.Logs())
}

// subnet is the pod subnet of a cluster: 10.X.Y.0/24 from its suffix, so
// that clusters of test binaries running at once do not collide.
func subnet(suffix string) string {
	var x, y int
	fmt.Sscanf(suffix[:2], "%x", &x)
	fmt.Sscanf(suffix[2:4], "%x", &y)
	return fmt.Sprintf("10.%d.%d.0/24", 128+x%100, y)
}

// cniConfig is a bridge network with host-local addresses and loopback.
func cniConfig(bridge, subnet, ipamDir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kubetest",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, bridge, subnet, ipamDir)
}

// containerdConfig keeps every path of the daemon under dir, with the CRI
// plugin on runc and CNI. restrict_oom_score_adj keeps the kubelet's
// negative OOM scores within what this process may set (a VM or a
// container may forbid lowering it).
func containerdConfig(dir, socket, sandbox, runc, cniBin, cniConf string) string {
	return fmt.Sprintf(`version = 2
root = "%[1]s/ctrd-root"
state = "%[1]s/ctrd-state"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "%[2]s"

[ttrpc]
  address = "%[2]s.ttrpc"

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/ctrd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[3]s"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "%[4]s"
        Root = "%[1]s/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%[5]s"
    conf_dir = "%[6]s"
`, dir, socket, sandbox, runc, cniBin, cniConf)
}

// kubeletConfig is a KubeletConfiguration for a test node: no QoS
// cgroups and cgroup v1 allowed (this VM), nothing evicted for disk or
// memory pressure, no image garbage collection, anonymous access.
func kubeletConfig(port int, socket, podLogs string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[2]s
imageServiceEndpoint: unix://%[2]s
podLogsDir: %[3]s
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "0%%"
  imagefs.available: "0%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
serializeImagePulls: false
resolvConf: ""
makeIPTablesUtilChains: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
registerNode: true
`, port, socket, podLogs)
}

// unmountUnder unmounts every mount below dir, deepest first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// drainNode deletes every pod at once and waits (a while) until the
// kubelet has torn them down.
func (c *Cluster) drainNode() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods := c.Client.CoreV1().Pods(metav1.NamespaceAll)
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	zero := int64(0)
	for _, p := range list.Items {
		c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	for ctx.Err() == nil {
		if list, err := pods.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cleanupNode removes what the node's containers could leave on the host
// once containerd is gone: runc containers, shims, the CNI bridge.
func (c *Cluster) cleanupNode() {
	if c.runc != "" {
		root := filepath.Join(c.dir, "runc")
		if ns, err := os.ReadDir(root); err == nil {
			for _, n := range ns {
				ids, _ := os.ReadDir(filepath.Join(root, n.Name()))
				for _, id := range ids {
					exec.Command(c.runc, "--root", filepath.Join(root, n.Name()), "delete", "--force", id.Name()).Run()
				}
			}
		}
	}
	killMatching(c.dir)
	if c.bridge != "" {
		exec.Command("ip", "link", "delete", c.bridge).Run()
	}
}

// killMatching kills the processes whose command line names dir (the
// shims of the node's containerd).
func killMatching(dir string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), dir+"/") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
