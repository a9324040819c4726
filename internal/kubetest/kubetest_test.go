package kubetest_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stokehq/stoke/internal/kubetest"
)

// TestClusterRunsAPod starts a control plane with a node and runs a pod of
// the sandbox image on it: scheduled, running with a pod IP, deleted.
func TestClusterRunsAPod(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{Kubelet: true})
	ns := c.Namespace(t, "smoke")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: kubetest.SandboxImage, ImagePullPolicy: corev1.PullNever}},
			RestartPolicy: corev1.RestartPolicyNever},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "sleeper", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			if p.Spec.NodeName != c.Node {
				t.Fatalf("pod on node %q, want %q", p.Spec.NodeName, c.Node)
			}
			break
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod failed: %+v\n%s", p.Status, c.Logs())
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod not running: %+v\n%s", p.Status, c.Logs())
		case <-time.After(time.Second):
		}
	}
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "sleeper", metav1.DeleteOptions{GracePeriodSeconds: new(int64(1))}); err != nil {
		t.Fatal(err)
	}
}
