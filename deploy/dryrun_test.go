package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/stokehq/stoke/internal/kubetest"
)

// TestDryRun creates every object the chart renders, for every value set
// that needs no CRDs, on a real kube-apiserver with a server-side dry run
// and strict field validation: the API server must accept each one as it
// would on `helm install`.
func TestDryRun(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	clients, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The release's namespace and the one the engines-elsewhere value
	// set names, for real: dry-run objects still need their namespace.
	const ns = "stoke"
	for _, name := range []string{ns, "stoke-engines"} {
		if _, err := clients.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace %s: %v", name, err)
		}
	}
	disco, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}

	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			if vs.crds {
				t.Skip("renders Prometheus Operator objects, whose CRDs a bare API server does not have")
			}
			m, err := render(t, ns, vs.values)
			if err != nil {
				t.Fatal(err)
			}
			if len(m) == 0 {
				t.Fatal("rendered nothing")
			}
			for _, o := range m {
				js, err := yaml.YAMLToJSON([]byte(o.YAML))
				if err != nil {
					t.Fatalf("%s %s: %v", o.Kind, o.Name, err)
				}
				u := &unstructured.Unstructured{}
				if err := u.UnmarshalJSON(js); err != nil {
					t.Fatalf("%s %s: %v", o.Kind, o.Name, err)
				}
				gvk := u.GroupVersionKind()
				mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Errorf("%s %s: the API server does not serve %s: %v", o.Kind, o.Name, gvk, err)
					continue
				}
				var res dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
				if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
					if u.GetNamespace() == "" {
						t.Errorf("%s %s is namespaced but has no namespace", o.Kind, o.Name)
						continue
					}
					res = dyn.Resource(mapping.Resource).Namespace(u.GetNamespace())
				} else if u.GetNamespace() != "" {
					t.Errorf("%s %s is cluster-scoped but has namespace %s", o.Kind, o.Name, u.GetNamespace())
				}
				_, err = res.Create(ctx, u, metav1.CreateOptions{
					DryRun:          []string{metav1.DryRunAll},
					FieldManager:    "stoke-test",
					FieldValidation: metav1.FieldValidationStrict,
				})
				if err != nil {
					t.Errorf("%s %s/%s refused: %v", o.Kind, u.GetNamespace(), o.Name, err)
				}
			}
		})
	}
}

// TestInstallUpgrade installs the chart for real with helm (objects only:
// no kubelet runs the pods), then upgrades it: the NOTES tell the way to
// the first token, and the admin key generated on install survives the
// upgrade (the chart's lookup of its own Secret).
func TestInstallUpgrade(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "stoke"
	if _, err := clients.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	adminKey := func() string {
		t.Helper()
		s, err := clients.CoreV1().Secrets(ns).Get(ctx, "stoke-admin", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the admin key Secret: %v", err)
		}
		return string(s.Data["admin-key"])
	}

	values := valuesFile(t, "bucket: s3://models\ngateway: {replicas: 1}\n")
	out, stderr, err := runHelm(t, "install", release, chartDir, "--namespace", ns, "--kubeconfig", c.Kubeconfig, "-f", values)
	if err != nil {
		t.Fatalf("helm install: %v\n%s%s", err, out, stderr)
	}
	for _, want := range []string{"port-forward service/stoke 8080:80", "get secret stoke-admin", "/v1/chat/completions", "stoke push"} {
		if !strings.Contains(out, want) {
			t.Errorf("helm install's notes have no %q:\n%s", want, out)
		}
	}
	key := adminKey()
	if len(key) != 43 {
		t.Fatalf("generated admin key of %d characters, want 43", len(key))
	}

	out, stderr, err = runHelm(t, "upgrade", release, chartDir, "--namespace", ns, "--kubeconfig", c.Kubeconfig, "-f", values, "--set", "engine.warm=2")
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s%s", err, out, stderr)
	}
	if got := adminKey(); got != key {
		t.Error("helm upgrade replaced the generated admin key")
	}
	cm, err := clients.CoreV1().ConfigMaps(ns).Get(ctx, "stoke-flags", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Data["STOKE_FLAG_WARM"]; got != "2" {
		t.Errorf("after the upgrade STOKE_FLAG_WARM=%q, want 2", got)
	}
}
