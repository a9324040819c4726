package deploy_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"sigs.k8s.io/yaml"

	"github.com/stokehq/stoke/internal/gobin"
)

// chartDir is the chart, from this package's directory.
const chartDir = "helm/stoke"

// release is the release name the tests render the chart as; it holds the
// chart's name, so the objects' fullname is "stoke".
const release = "stoke"

// readChart reads every file of the chart, once: helm reads them in
// another process, which go test's cache does not see, so without this a
// change to the chart would not rerun a cached test. (It must run inside
// a test, where go test logs the files opened, not in TestMain.)
var readChart = sync.OnceValue(func() error {
	return filepath.WalkDir(chartDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		_, err = os.ReadFile(path)
		return err
	})
})

// helmBinary returns the helm CLI: $(go env GOPATH)/bin/helm (which
// scripts/install-helm.sh builds), else helm on PATH. Without one the test
// is skipped, or fails under STOKE_REQUIRE_KUBERNETES=1.
func helmBinary(t testing.TB) string {
	t.Helper()
	p, err := gobin.Find("helm")
	if err == nil {
		return p
	}
	msg := err.Error() + "; scripts/install-helm.sh builds it"
	if os.Getenv("STOKE_REQUIRE_KUBERNETES") == "1" {
		t.Fatal(msg + " (STOKE_REQUIRE_KUBERNETES=1)")
	}
	t.Skip(msg)
	return ""
}

// runHelm runs helm with its configuration, cache and data directories
// in a temporary directory, returning its standard output and error.
func runHelm(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	if err := readChart(); err != nil {
		t.Fatalf("reading the chart: %v", err)
	}
	home := t.TempDir()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// valuesFile writes values (YAML) into a file for helm's -f, in a
// directory of its own rather than t.TempDir(), whose name has the test's
// and may have commas, which -f splits paths at.
func valuesFile(t testing.TB, values string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "stoke-chart-values")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(p, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// object is one rendered document.
type object struct {
	Kind, Name, Namespace string
	// YAML is the document as rendered.
	YAML string
	// Typed is the document decoded strictly (unknown fields are errors)
	// into its client-go type for the kinds the chart renders, else into a
	// map.
	Typed any
}

// manifest is what `helm template` rendered.
type manifest []object

// newTyped returns a pointer to the Go type of kind ("" for none).
func newTyped(kind string) any {
	switch kind {
	case "ConfigMap":
		return &corev1.ConfigMap{}
	case "Secret":
		return &corev1.Secret{}
	case "Service":
		return &corev1.Service{}
	case "ServiceAccount":
		return &corev1.ServiceAccount{}
	case "PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}
	case "Deployment":
		return &appsv1.Deployment{}
	case "Role":
		return &rbacv1.Role{}
	case "RoleBinding":
		return &rbacv1.RoleBinding{}
	case "PriorityClass":
		return &schedulingv1.PriorityClass{}
	case "PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	}
	return nil
}

// parseManifest splits helm's output into documents and decodes each.
func parseManifest(out string) (manifest, error) {
	var m manifest
	for i, doc := range strings.Split("\n"+out, "\n---\n") {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, fmt.Errorf("document %d: %w\n%s", i, err, doc)
		}
		if head.Kind == "" && head.APIVersion == "" {
			continue // only comments
		}
		if head.Kind == "" || head.APIVersion == "" || head.Metadata.Name == "" {
			return nil, fmt.Errorf("document %d has no apiVersion, kind or name:\n%s", i, doc)
		}
		o := object{Kind: head.Kind, Name: head.Metadata.Name, Namespace: head.Metadata.Namespace, YAML: doc}
		if typed := newTyped(head.Kind); typed != nil {
			if err := yaml.UnmarshalStrict([]byte(doc), typed); err != nil {
				return nil, fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
			}
			o.Typed = typed
		} else {
			var generic map[string]any
			if err := yaml.UnmarshalStrict([]byte(doc), &generic); err != nil {
				return nil, fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
			}
			o.Typed = generic
		}
		m = append(m, o)
	}
	return m, nil
}

// render renders the chart with values into namespace ns.
func render(t testing.TB, ns, values string) (manifest, error) {
	t.Helper()
	out, stderr, err := runHelm(t, "template", release, chartDir, "--namespace", ns, "-f", valuesFile(t, values))
	if err != nil {
		return nil, fmt.Errorf("helm template: %v: %s", err, strings.TrimSpace(stderr))
	}
	return parseManifest(out)
}

// kinds counts the objects by kind.
func (m manifest) kinds() map[string]int {
	n := map[string]int{}
	for _, o := range m {
		n[o.Kind]++
	}
	return n
}

// all returns the typed objects of one kind.
func all[T any](m manifest, kind string) []*T {
	var out []*T
	for _, o := range m {
		if o.Kind == kind {
			if v, ok := o.Typed.(*T); ok {
				out = append(out, v)
			}
		}
	}
	return out
}

// one returns the only object of a kind, failing the test unless there is
// exactly one.
func one[T any](t testing.TB, m manifest, kind string) *T {
	t.Helper()
	objs := all[T](m, kind)
	if len(objs) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(objs), kind)
	}
	return objs[0]
}

// byName returns the object of kind and name, or nil.
func byName[T any](m manifest, kind, name string) *T {
	for _, o := range m {
		if o.Kind == kind && o.Name == name {
			if v, ok := o.Typed.(*T); ok {
				return v
			}
		}
	}
	return nil
}
