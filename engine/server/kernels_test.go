package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestKernelSetMetric checks /metrics names the kernel set the server was
// given, from the start (blank) through a load and an unload, and that a
// server given none exports no such series.
func TestKernelSetMetric(t *testing.T) {
	ml := newModelLoader(t, false)
	f := newFixture(t, ml.load, "", Options{KernelSet: "avx2"})
	if got := f.metric(t, `stoke_engine_kernels{set="avx2"}`); got != 1 {
		t.Fatalf(`blank server: stoke_engine_kernels{set="avx2"} = %v, want 1`, got)
	}
	for _, step := range []struct{ path, body string }{{"/admin/load", `{"path":"model"}`}, {"/admin/unload", ""}} {
		if status, b := f.do(t, http.MethodPost, step.path, step.body); status != http.StatusOK {
			t.Fatalf("%s: %d %s", step.path, status, b)
		}
		if got := f.metric(t, `stoke_engine_kernels{set="avx2"}`); got != 1 {
			t.Fatalf(`after %s: stoke_engine_kernels{set="avx2"} = %v, want 1`, step.path, got)
		}
	}

	plain := newFixture(t, ml.load, "", Options{})
	if _, b := plain.do(t, http.MethodGet, "/metrics", ""); strings.Contains(string(b), "stoke_engine_kernels") {
		t.Fatalf("a server given no kernel set exports stoke_engine_kernels:\n%s", b)
	}

	// The series lives on the caller's registry, which refuses a second one.
	if _, err := New(Options{Loader: ml.load, Registry: f.reg, KernelSet: "avx2"}); err == nil || !strings.Contains(err.Error(), "stoke_engine_kernels") {
		t.Fatalf("second server on one registry: error %v, want one naming stoke_engine_kernels", err)
	}
	if _, err := New(Options{Loader: ml.load, Registry: prometheus.NewRegistry(), KernelSet: "generic"}); err != nil {
		t.Fatal(err)
	}
}
