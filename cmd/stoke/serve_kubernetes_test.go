//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stokehq/stoke/images"
	"github.com/stokehq/stoke/internal/kubetest"
	kuberuntime "github.com/stokehq/stoke/runtime/kubernetes"
)

// TestServeKubernetes runs `stoke serve --runtime kubernetes` against a
// real control plane and kubelet: the first request to a pushed model is
// served by an engine pod of the engine image, a spec asking for two
// replicas creates a second pod, a deleted pod's requests go to the other
// replica while a new pod replaces it, a restarted gateway re-adopts the
// running pods, and scaling to zero deletes the pods but the warm pool's
// one (no sleep budget: nothing else is left holding the node).
func TestServeKubernetes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a Kubernetes control plane and engine pods; not with -short")
	}
	cluster := kubetest.Start(t, kubetest.Options{Kubelet: true})
	ns := cluster.Namespace(t, "stoke")
	res, err := images.Build(context.Background(), images.Options{Binary: staticStoke(t), Out: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cluster.ImportImage(t, res.Archives[images.EngineImage])

	bucketDir := t.TempDir()
	pushTo(t, bucketDir, "chat", "replicas:\n  min: 0\n  max: 2\nidle_delay: 1h\n")
	args := []string{"--data", t.TempDir(), "--bucket", "file://" + bucketDir, "--watch-interval", "100ms",
		"--warm", "1", "--slots", "3", "--kv-cache-memory", "64MiB", "--threads", "1", "--sleep-budget", "0",
		"--runtime", "kubernetes", "--kubeconfig", cluster.Kubeconfig, "--kube-namespace", ns,
		"--engine-image", res.Refs[images.EngineImage], "--kube-image-pull-policy", "Never",
		"--kube-engine-cpu", "0", "--kube-engine-memory", "0"}
	s := launchServe(t, nil, freeAddr(t), args...)
	s.waitHealthy(t)
	ctx := context.Background()
	pods := func() map[string]corev1.Pod {
		list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kuberuntime.LabelRuntime})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]corev1.Pod{}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				out[p.Name] = p
			}
		}
		return out
	}
	waitUntil(t, "the warm pool's blank pod", 3*time.Minute, func() bool {
		return len(pods()) == 1 && runtimesIn(t, s.base, "blank", "") == 1
	})

	waitUntil(t, "chat is deployed", time.Minute, func() bool {
		resp, err := http.Get(s.base + "/v1/models/chat")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	first := complete(t, s.base, "chat")
	pod, ok := pods()[first]
	if !ok {
		t.Fatalf("the first answer came from %q, which is no engine pod of the install (pods: %v)\n%s", first, names(pods()), cluster.Logs())
	}
	if img := pod.Spec.Containers[0].Image; img != res.Refs[images.EngineImage] || pod.Spec.NodeName != cluster.Node || pod.Status.PodIP == "" {
		t.Errorf("pod %s: image %s on node %q at %q, want the engine image on %s with a pod IP", first, img, pod.Spec.NodeName, pod.Status.PodIP, cluster.Node)
	}
	var acq struct{ Tier string }
	getJSON(t, s.base+"/admin/deployments/chat/acquisition?runtime="+first, &acq)
	if acq.Tier != "t3" {
		t.Errorf("the first acquisition was %s, want t3: the warm pool's blank pod, weights from the bucket", acq.Tier)
	}

	put(t, s.base+"/admin/deployments/chat", `{"replicas":{"min":2,"max":2},"idle_delay":"1h"}`)
	waitUntil(t, "two ready replicas and the warm pool in three pods", 3*time.Minute, func() bool {
		return readyReplicas(t, s.base, "chat") == 2 && len(pods()) == 3
	})

	// Delete the first pod under a steady flow of requests: every request
	// is answered (by the other replica), and a new pod replaces it.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := tryComplete(s.base, "chat"); err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
		}
	}()
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, first, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a new pod replaces the deleted one, both ready", 3*time.Minute, func() bool {
		p := pods()
		_, old := p[first]
		return !old && len(p) == 3 && readyReplicas(t, s.base, "chat") == 2
	})
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Errorf("a request while the pod was deleted: %v", err)
	default:
	}

	// A gateway killed outright leaves its pods running; the next one
	// re-adopts them and serves from them without loading anything.
	before := pods()
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s = launchServe(t, nil, freeAddr(t), args...)
	s.waitHealthy(t)
	if _, ok := before[complete(t, s.base, "chat")]; !ok {
		t.Errorf("after the restart the answer came from no pod of before the restart %v", names(before))
	}
	if log := s.log(); strings.Contains(log, "acquisition failed") || strings.Contains(log, "tier=t4") {
		t.Errorf("the restarted gateway started or failed a runtime instead of re-adopting its pods:\n%s", log)
	}

	put(t, s.base+"/admin/deployments/chat", `{"replicas":{"min":0,"max":2},"idle_delay":"1s"}`)
	waitUntil(t, "scaled to zero: the warm pool's blank pod alone left", 3*time.Minute, func() bool {
		return len(pods()) == 1 && runtimesIn(t, s.base, "blank", "") == 1
	})
}

// tryComplete is complete that returns its failure.
func tryComplete(base, model string) error {
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","prompt":"hello","max_tokens":2}`))
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%d %s", resp.StatusCode, body)
	}
	return nil
}

// put sends a PUT with a JSON body and fails the test unless it is 200.
func put(t testing.TB, url, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT %s: %d %s", url, resp.StatusCode, b)
	}
}

func names(pods map[string]corev1.Pod) []string {
	var out []string
	for n := range pods {
		out = append(out, n)
	}
	return out
}
