package deploy_test

import (
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"sigs.k8s.io/yaml"

	"github.com/stokehq/stoke/internal/config"
)

// valueSet is one set of values the chart is installed with.
type valueSet struct {
	name   string
	values string
	// kinds is how many objects of each kind it renders (exactly).
	kinds map[string]int
	// flags are serve flags the gateway must get, with their values
	// after Kubernetes expands the arguments ("secret:NAME/KEY" for a
	// value from a Secret the chart does not render).
	flags map[string]string
	// noFlags are serve flags the gateway must not get.
	noFlags []string
	// secrets are values that must never be in a ConfigMap or the
	// Deployment (those of the Secrets the chart renders are checked too).
	secrets []string
	// crds: it renders Prometheus Operator objects, which a bare API
	// server does not know.
	crds bool
	// check asserts what is particular to the set.
	check func(t *testing.T, m manifest, g gateway)
}

// base is what every set starts with.
var base = map[string]int{"ConfigMap": 3, "Secret": 1, "Service": 1, "ServiceAccount": 1, "Deployment": 1, "Role": 1, "RoleBinding": 1, "PriorityClass": 2}

// kinds returns base with changes (0 deletes a kind).
func kinds(changes map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range changes {
		if v == 0 {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

var valueSets = []valueSet{
	{
		name: "one gateway, SQLite under --data",
		values: `
bucket: s3://models/prod
gateway: {replicas: 1}
`,
		kinds: kinds(nil),
		flags: map[string]string{
			"runtime": "kubernetes", "bucket": "s3://models/prod", "listen": "0.0.0.0:8080", "data": "/var/lib/stoke",
			"leader-elect": "true", "leader-elect-resource-name": "stoke-gateway", "leader-elect-lease-duration": "15s",
			"leader-elect-renew-deadline": "10s", "leader-elect-retry-period": "2s",
			"engine-image": "stoke.local/engine:dev", "kube-engine-cpu": "2", "kube-engine-memory": "4Gi", "kube-engine-gpus": "0",
			"kube-cache-path": "/var/lib/stoke/cache", "kube-priority-class-interactive": "stoke-interactive",
			"kube-priority-class-batch": "stoke-batch", "slots": "4", "spot-slots": "0", "warm": "1", "auth": "auto",
		},
		noFlags: []string{"state", "limits", "kube-namespace", "kube-node-selector", "kube-tolerations", "kube-spot-node-selector", "kube-spot-tolerations", "routes", "endpoint", "path-style"},
		check: func(t *testing.T, m manifest, g gateway) {
			if s := g.dep.Spec.Strategy; s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 0 {
				t.Errorf("strategy %+v, want a rolling update that keeps every pod until its successor is ready", s)
			}
			if g.dep.Spec.Template.Spec.Affinity != nil {
				t.Errorf("one replica has affinity %+v, want none", g.dep.Spec.Template.Spec.Affinity)
			}
			if img := g.container.Image; img != "stoke.local/stoke:dev" {
				t.Errorf("gateway image %q, want stoke.local/stoke:dev", img)
			}
			if admin := byName[corev1.Secret](m, "Secret", "stoke-admin"); admin == nil || len(admin.Data["admin-key"]) != 43 {
				t.Errorf("admin key Secret %v, want a generated 43-character key", admin)
			}
		},
	},
	{
		name: "Postgres, Redis and leader election (the default 2 replicas)",
		values: `
bucket: s3://models
s3:
  endpoint: http://minio.minio.svc:9000
  region: us-east-1
  pathStyle: true
  credentials: {accessKeyId: AKIAEXAMPLE0001, secretAccessKey: s3-secret-9a2f}
state:
  postgres: {url: "postgres://stoke:pg-password-7f3@pg.db.svc:5432/stoke?sslmode=disable"}
limits:
  redis: {url: "redis://:redis-password-c1d@redis.db.svc:6379/0"}
auth:
  adminKey: {value: admin-key-5e9b}
`,
		kinds: kinds(map[string]int{"Secret": 4, "PodDisruptionBudget": 1}),
		flags: map[string]string{
			"runtime": "kubernetes", "leader-elect": "true", "leader-elect-resource-name": "stoke-gateway",
			"state":    "postgres://stoke:pg-password-7f3@pg.db.svc:5432/stoke?sslmode=disable",
			"limits":   "redis://:redis-password-c1d@redis.db.svc:6379/0",
			"endpoint": "http://minio.minio.svc:9000", "region": "us-east-1", "path-style": "true",
		},
		secrets: []string{"pg-password-7f3", "redis-password-c1d", "s3-secret-9a2f", "AKIAEXAMPLE0001", "admin-key-5e9b"},
		check: func(t *testing.T, m manifest, g gateway) {
			if r := g.dep.Spec.Replicas; r == nil || *r != 2 {
				t.Errorf("replicas %v, want 2", r)
			}
			for _, name := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
				if ref := g.secretRef(name); ref == nil || ref.Name != "stoke-s3" || ref.Key != name {
					t.Errorf("env %s from %+v, want Secret stoke-s3 key %s", name, ref, name)
				}
			}
			if g.env["AWS_ACCESS_KEY_ID"] != "AKIAEXAMPLE0001" || g.env["AWS_SECRET_ACCESS_KEY"] != "s3-secret-9a2f" {
				t.Errorf("AWS_* are %q/%q, want the values' credentials", g.env["AWS_ACCESS_KEY_ID"], g.env["AWS_SECRET_ACCESS_KEY"])
			}
			if a := g.dep.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil {
				t.Errorf("two replicas have affinity %+v, want a pod anti-affinity that spreads them", a)
			}
			pdb := one[policyv1.PodDisruptionBudget](t, m, "PodDisruptionBudget")
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
				t.Errorf("PodDisruptionBudget minAvailable %v, want 1", pdb.Spec.MinAvailable)
			}
			if !selects(pdb.Spec.Selector.MatchLabels, g.dep.Spec.Template.Labels) {
				t.Errorf("PodDisruptionBudget selects %v, not the gateway pods %v", pdb.Spec.Selector.MatchLabels, g.dep.Spec.Template.Labels)
			}
			if admin := byName[corev1.Secret](m, "Secret", "stoke-admin"); admin == nil || string(admin.Data["admin-key"]) != "admin-key-5e9b" {
				t.Errorf("admin key Secret %v, want the key of the values", admin)
			}
		},
	},
	{
		name: "spot pool with tolerations",
		values: `
bucket: s3://models
gateway: {replicas: 1}
engine: {slots: 6, spotSlots: 2, gpus: 1, cpu: 8, memory: 48Gi}
nodePools:
  onDemand:
    nodeSelector: {pool: gpu, node.kubernetes.io/instance-type: g6.xlarge}
    tolerations:
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  spot:
    nodeSelector: {karpenter.sh/capacity-type: spot}
    tolerations:
      - {key: stoke.dev/spot, operator: Equal, value: "true", effect: NoSchedule}
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
priorityClasses:
  interactive: {name: llm-interactive, value: 5000}
  batch: {name: llm-batch, value: -10}
`,
		kinds: kinds(nil),
		flags: map[string]string{
			"slots": "6", "spot-slots": "2", "kube-engine-gpus": "1", "kube-engine-cpu": "8", "kube-engine-memory": "48Gi",
			"kube-node-selector":              "node.kubernetes.io/instance-type=g6.xlarge,pool=gpu",
			"kube-tolerations":                "nvidia.com/gpu:NoSchedule",
			"kube-spot-node-selector":         "karpenter.sh/capacity-type=spot",
			"kube-spot-tolerations":           "stoke.dev/spot=true:NoSchedule,nvidia.com/gpu:NoSchedule",
			"kube-priority-class-interactive": "llm-interactive", "kube-priority-class-batch": "llm-batch",
		},
		check: func(t *testing.T, m manifest, g gateway) {
			if pc := byName[schedulingv1.PriorityClass](m, "PriorityClass", "llm-batch"); pc == nil || pc.Value != -10 {
				t.Errorf("PriorityClass llm-batch %v, want value -10", pc)
			}
		},
	},
	{
		name: "existing secrets",
		values: `
bucket: s3://models
s3:
  credentials: {existingSecret: s3-creds, accessKeyIdKey: id, secretAccessKeyKey: secret}
auth:
  adminKey: {existingSecret: stoke-admin-key, key: key}
state:
  postgres: {existingSecret: stoke-pg, key: uri}
limits:
  redis: {existingSecret: stoke-redis}
`,
		kinds: kinds(map[string]int{"Secret": 0, "PodDisruptionBudget": 1}),
		flags: map[string]string{
			"state": "secret:stoke-pg/uri", "limits": "secret:stoke-redis/url", "admin-key-file": "/etc/stoke/admin/key", "leader-elect": "true",
		},
		check: func(t *testing.T, m manifest, g gateway) {
			if g.env["AWS_ACCESS_KEY_ID"] != "secret:s3-creds/id" || g.env["AWS_SECRET_ACCESS_KEY"] != "secret:s3-creds/secret" {
				t.Errorf("AWS_* from %q/%q, want Secret s3-creds keys id and secret", g.env["AWS_ACCESS_KEY_ID"], g.env["AWS_SECRET_ACCESS_KEY"])
			}
			v := g.volume("admin-key")
			if v == nil || v.Secret == nil || v.Secret.SecretName != "stoke-admin-key" {
				t.Errorf("admin-key volume %+v, want Secret stoke-admin-key", v)
			}
		},
	},
	{
		name: "engines in their own namespace, routes and extra flags",
		values: `
bucket: s3://models
gateway:
  replicas: 1
  extraFlags: {prefetch: false, read-timeout: 2m}
engine: {namespace: stoke-engines, simProfile: h100-llama-8b}
routes:
  routes:
    - name: auto
      rules:
        - match: {keywords: [code]}
          to: coder
      split: [{to: chat, weight: 1}]
  providers:
    - {name: openai, base_url: "https://api.openai.com/v1", model: gpt-4o-mini, api_key_env: OPENAI_API_KEY}
`,
		kinds: kinds(map[string]int{"ConfigMap": 4, "Role": 2, "RoleBinding": 2}),
		flags: map[string]string{
			"kube-namespace": "stoke-engines", "routes": "/etc/stoke/routes/routes.yaml", "prefetch": "false",
			"read-timeout": "2m", "sim-profile": "h100-llama-8b",
		},
		check: func(t *testing.T, m manifest, g gateway) {
			cm := byName[corev1.ConfigMap](m, "ConfigMap", "stoke-routes")
			if cm == nil {
				t.Fatal("no ConfigMap stoke-routes")
			}
			rs, err := config.ParseRoutesYAML([]byte(cm.Data["routes.yaml"]))
			if err != nil {
				t.Fatalf("serve would refuse the routes file: %v\n%s", err, cm.Data["routes.yaml"])
			}
			if len(rs.Routes) != 1 || rs.Routes[0].Name != "auto" || len(rs.Routes[0].Rules) != 1 || len(rs.Providers) != 1 {
				t.Errorf("routes file %+v, want the values' route auto and provider openai", rs)
			}
			if !g.mounted("routes", "/etc/stoke/routes") {
				t.Error("the routes ConfigMap is not mounted at /etc/stoke/routes")
			}
			if g.dep.Spec.Template.Annotations["checksum/routes"] == "" {
				t.Error("no checksum/routes annotation: a change of the routes would not roll the gateway")
			}
		},
	},
	{
		name: "Prometheus Operator, PriorityClasses made elsewhere",
		values: `
bucket: s3://models
gateway: {replicas: 1}
priorityClasses: {create: false}
monitoring:
  rules: {prometheusRule: true, labels: {release: kube-prometheus-stack}}
  serviceMonitor: {enabled: true}
`,
		kinds: kinds(map[string]int{"ConfigMap": 2, "PriorityClass": 0, "PrometheusRule": 1, "ServiceMonitor": 1}),
		flags: map[string]string{"kube-priority-class-interactive": "stoke-interactive", "kube-priority-class-batch": "stoke-batch"},
		crds:  true,
	},
	{
		name: "one gateway with its state on a volume",
		values: `
bucket: s3://models
gateway:
  replicas: 1
  persistence: {enabled: true, size: 20Gi, storageClass: fast}
`,
		kinds: kinds(map[string]int{"PersistentVolumeClaim": 1}),
		flags: map[string]string{"data": "/var/lib/stoke"},
		check: func(t *testing.T, m manifest, g gateway) {
			if g.dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("strategy %s, want Recreate (one pod at a time holds --data)", g.dep.Spec.Strategy.Type)
			}
			pvc := one[corev1.PersistentVolumeClaim](t, m, "PersistentVolumeClaim")
			if v := g.volume("data"); v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != pvc.Name {
				t.Errorf("data volume %+v, want the claim %s", v, pvc.Name)
			}
			if got := pvc.Spec.Resources.Requests.Storage().String(); got != "20Gi" {
				t.Errorf("claim of %s, want 20Gi", got)
			}
		},
	},
}

// TestTemplate renders every value set and checks what the gateway needs.
func TestTemplate(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			m, err := render(t, "stoke", vs.values)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.kinds(); !maps.Equal(got, vs.kinds) {
				t.Errorf("kinds %v, want %v", got, vs.kinds)
			}
			for _, o := range m {
				if o.Kind != "PriorityClass" && o.Namespace == "" {
					t.Errorf("%s %s has no namespace", o.Kind, o.Name)
				}
			}
			g := gatewayOf(t, m)
			for name, want := range vs.flags {
				if got, ok := g.flags[name]; !ok || got != want {
					t.Errorf("--%s=%q (set: %v), want %q", name, got, ok, want)
				}
			}
			for _, name := range vs.noFlags {
				if got, ok := g.flags[name]; ok {
					t.Errorf("--%s=%q, want no such flag", name, got)
				}
			}
			checkGateway(t, m, g)
			checkRBAC(t, m, g)
			checkPriorityClasses(t, m, g)
			checkNoSecretInConfigMaps(t, m, vs.secrets)
			if vs.check != nil {
				vs.check(t, m, g)
			}
		})
	}
}

// TestTemplateRefuses checks that values that cannot work fail the
// render, saying what to change.
func TestTemplateRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"the defaults: no bucket", ``, "bucket is required"},
		{"a file:// bucket", "bucket: file:///models\ngateway: {replicas: 1}", "must be an s3://bucket"},
		{"the defaults with a bucket: two replicas without Postgres", "bucket: s3://m", "gateway.replicas=2 needs shared state: set state.postgres.url"},
		{"two replicas without Redis", "bucket: s3://m\nstate: {postgres: {url: postgres://p/s}}", "gateway.replicas=2 needs shared limit counters"},
		{"three replicas without leader election", `
bucket: s3://m
gateway: {replicas: 3}
leaderElection: {enabled: false}
state: {postgres: {url: postgres://p/s}}
limits: {redis: {url: redis://r:6379/0}}
`, "gateway.replicas=3 needs leaderElection.enabled=true"},
		{"a volume for two replicas", `
bucket: s3://m
gateway: {persistence: {enabled: true}}
state: {postgres: {url: postgres://p/s}}
limits: {redis: {url: redis://r:6379/0}}
`, "gateway.persistence.enabled needs gateway.replicas=1"},
		{"no replica", "bucket: s3://m\ngateway: {replicas: 0}", "gateway.replicas=0: at least 1"},
		{"batch above interactive", "bucket: s3://m\ngateway: {replicas: 1}\npriorityClasses: {interactive: {value: 10}, batch: {value: 10}}", "interactive.value (10) must be above batch.value (10)"},
		{"more spot slots than slots", "bucket: s3://m\ngateway: {replicas: 1}\nengine: {slots: 2, spotSlots: 3}", "engine.spotSlots=3: at most engine.slots=2"},
		{"a toleration without an effect", "bucket: s3://m\ngateway: {replicas: 1}\nnodePools: {spot: {tolerations: [{key: spot, value: x}]}}", `toleration "spot" needs an effect`},
		{"an extra flag the chart sets", "bucket: s3://m\ngateway: {replicas: 1, extraFlags: {runtime: process}}", "gateway.extraFlags.runtime: the chart sets --runtime itself"},
		{"a secret flag as an extra flag", "bucket: s3://m\ngateway: {replicas: 1, extraFlags: {state: postgres://p/s}}", "--state is secret; set it with state.postgres"},
		{"a Postgres URL that is not one", "bucket: s3://m\ngateway: {replicas: 1}\nstate: {postgres: {url: mysql://x}}", "state.postgres.url: must be a postgres://"},
		{"half the S3 credentials", "bucket: s3://m\ngateway: {replicas: 1}\ns3: {credentials: {accessKeyId: A}}", "set both accessKeyId and secretAccessKey"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, "stoke", tc.values)
			if err == nil {
				t.Fatalf("rendered, want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one with %q", err, tc.want)
			}
		})
	}
}

// TestLint runs helm lint --strict on the chart's defaults and on every
// value set: no errors and no warnings.
func TestLint(t *testing.T) {
	cases := []struct{ name, values string }{{"defaults", ""}}
	for _, vs := range valueSets {
		cases = append(cases, struct{ name, values string }{vs.name, vs.values})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir}
			if tc.values != "" {
				args = append(args, "-f", valuesFile(t, tc.values))
			}
			out, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s%s", err, out, stderr)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "[WARNING]") || strings.Contains(line, "[ERROR]") {
					t.Errorf("helm lint: %s", line)
				}
			}
			if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Errorf("helm lint said:\n%s", out)
			}
		})
	}
}

// TestMonitoring checks the rules and the dashboard the chart installs
// against the files in deploy/helm/stoke/files.
func TestMonitoring(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join(chartDir, "files/prometheus/stoke-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dashboard, err := os.ReadFile(filepath.Join(chartDir, "files/grafana/stoke-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		Groups []map[string]any `json:"groups"`
	}
	if err := yaml.Unmarshal(rules, &want); err != nil || len(want.Groups) == 0 {
		t.Fatalf("stoke-rules.yaml: %d groups (%v)", len(want.Groups), err)
	}

	for _, tc := range []struct {
		name, values string
		operator     bool
	}{
		{"ConfigMap", "bucket: s3://m\ngateway: {replicas: 1}", false},
		{"PrometheusRule", "bucket: s3://m\ngateway: {replicas: 1}\nmonitoring: {rules: {prometheusRule: true}}", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := render(t, "stoke", tc.values)
			if err != nil {
				t.Fatal(err)
			}
			dash := byName[corev1.ConfigMap](m, "ConfigMap", "stoke-dashboard")
			if dash == nil {
				t.Fatal("no ConfigMap stoke-dashboard")
			}
			if dash.Labels["grafana_dashboard"] != "1" {
				t.Errorf("dashboard labels %v, want grafana_dashboard: \"1\" for Grafana's sidecar", dash.Labels)
			}
			if !jsonEqual(t, dash.Data["stoke-dashboard.json"], string(dashboard)) {
				t.Error("the dashboard ConfigMap's JSON differs from files/grafana/stoke-dashboard.json")
			}
			cm := byName[corev1.ConfigMap](m, "ConfigMap", "stoke-rules")
			var pr map[string]any
			for _, o := range m {
				if o.Kind == "PrometheusRule" {
					pr = o.Typed.(map[string]any)
				}
			}
			if !tc.operator {
				if cm == nil || pr != nil {
					t.Fatalf("rules ConfigMap %v, PrometheusRule %v; want the ConfigMap only", cm != nil, pr != nil)
				}
				if strings.TrimSpace(cm.Data["stoke-rules.yaml"]) != strings.TrimSpace(string(rules)) {
					t.Error("the rules ConfigMap differs from files/prometheus/stoke-rules.yaml")
				}
				return
			}
			if cm != nil || pr == nil {
				t.Fatalf("rules ConfigMap %v, PrometheusRule %v; want the PrometheusRule only", cm != nil, pr != nil)
			}
			if pr["apiVersion"] != "monitoring.coreos.com/v1" {
				t.Errorf("PrometheusRule apiVersion %v", pr["apiVersion"])
			}
			got, _ := json.Marshal(pr["spec"])
			wantJSON, _ := json.Marshal(map[string]any{"groups": want.Groups})
			if !jsonEqual(t, string(got), string(wantJSON)) {
				t.Error("the PrometheusRule's spec differs from files/prometheus/stoke-rules.yaml's groups")
			}
		})
	}
}

// gateway is the rendered gateway Deployment, its container, the
// environment Kubernetes gives it and the serve flags its arguments
// expand to.
type gateway struct {
	dep       *appsv1.Deployment
	container *corev1.Container
	// env is every variable of the container: a ConfigMap's or a
	// rendered Secret's value, "secret:NAME/KEY" for a Secret the chart
	// does not render, "field:PATH" from the downward API.
	env   map[string]string
	args  []string
	flags map[string]string
}

// gatewayOf finds the gateway and expands its arguments as the kubelet
// does, failing the test on a reference to nothing.
func gatewayOf(t *testing.T, m manifest) gateway {
	t.Helper()
	dep := one[appsv1.Deployment](t, m, "Deployment")
	cs := dep.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%d containers, want 1", len(cs))
	}
	g := gateway{dep: dep, container: &cs[0], env: map[string]string{}, flags: map[string]string{}}
	for _, from := range g.container.EnvFrom {
		if from.ConfigMapRef == nil {
			t.Fatalf("envFrom %+v: want ConfigMaps only", from)
		}
		cm := byName[corev1.ConfigMap](m, "ConfigMap", from.ConfigMapRef.Name)
		if cm == nil {
			t.Fatalf("envFrom ConfigMap %s is not rendered", from.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			g.env[k] = v
		}
	}
	for _, e := range g.container.Env {
		switch {
		case e.ValueFrom == nil:
			g.env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if s := byName[corev1.Secret](m, "Secret", ref.Name); s != nil {
				v, ok := s.Data[ref.Key]
				if !ok {
					t.Fatalf("env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
				}
				g.env[e.Name] = string(v)
			} else {
				g.env[e.Name] = "secret:" + ref.Name + "/" + ref.Key
			}
		case e.ValueFrom.FieldRef != nil:
			g.env[e.Name] = "field:" + e.ValueFrom.FieldRef.FieldPath
		default:
			t.Fatalf("env %s: unexpected source %+v", e.Name, e.ValueFrom)
		}
	}
	for _, a := range g.container.Args {
		x := expand(a, g.env)
		if strings.Contains(x, "$(") {
			t.Errorf("argument %q expands to %q: a reference to no variable", a, x)
		}
		g.args = append(g.args, x)
	}
	if len(g.args) == 0 || g.args[0] != "serve" {
		t.Fatalf("arguments %q, want serve and its flags", g.args)
	}
	for _, a := range g.args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("argument %q, want --NAME=VALUE", a)
			continue
		}
		if _, dup := g.flags[name]; dup {
			t.Errorf("--%s given twice", name)
		}
		g.flags[name] = value
	}
	return g
}

// expand expands $(NAME) in s from env as the kubelet expands container
// arguments: $$ is a $, and a reference to an undefined variable stays.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// secretRef returns the Secret reference of env NAME, or nil.
func (g gateway) secretRef(name string) *corev1.SecretKeySelector {
	for _, e := range g.container.Env {
		if e.Name == name && e.ValueFrom != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}

// volume returns the pod's volume NAME, or nil.
func (g gateway) volume(name string) *corev1.Volume {
	for i, v := range g.dep.Spec.Template.Spec.Volumes {
		if v.Name == name {
			return &g.dep.Spec.Template.Spec.Volumes[i]
		}
	}
	return nil
}

// mounted reports whether volume NAME is mounted at path.
func (g gateway) mounted(name, path string) bool {
	for _, vm := range g.container.VolumeMounts {
		if vm.Name == name && vm.MountPath == path {
			return g.volume(name) != nil
		}
	}
	return false
}

// checkGateway checks what every gateway needs: the Kubernetes runtime,
// leader election with several replicas, the downward API, its admin key,
// probes, and a Service and ServiceAccount that match.
func checkGateway(t *testing.T, m manifest, g gateway) {
	t.Helper()
	if g.flags["runtime"] != "kubernetes" {
		t.Errorf("--runtime=%q, want kubernetes", g.flags["runtime"])
	}
	if r := g.dep.Spec.Replicas; r != nil && *r > 1 && g.flags["leader-elect"] != "true" {
		t.Errorf("%d replicas with --leader-elect=%q, want true", *r, g.flags["leader-elect"])
	}
	for name, want := range map[string]string{"POD_NAME": "field:metadata.name", "POD_NAMESPACE": "field:metadata.namespace", "POD_IP": "field:status.podIP"} {
		if g.env[name] != want {
			t.Errorf("env %s=%q, want %q (the downward API)", name, g.env[name], want)
		}
	}
	// The admin key file is in the mounted admin key Secret.
	keyFile := g.flags["admin-key-file"]
	dir, key := filepath.Split(keyFile)
	v := g.volume("admin-key")
	if !g.mounted("admin-key", filepath.Clean(dir)) || v.Secret == nil {
		t.Errorf("--admin-key-file=%s is not in the mounted admin key Secret", keyFile)
	} else if !slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == key }) {
		t.Errorf("the admin key volume %+v has no file %s", v.Secret, key)
	}
	if s := byName[corev1.Secret](m, "Secret", v.Secret.SecretName); s != nil && len(s.Data[v.Secret.Items[0].Key]) == 0 {
		t.Errorf("Secret %s has no admin key under %s", s.Name, v.Secret.Items[0].Key)
	}
	if g.flags["data"] != "" && !g.mounted("data", g.flags["data"]) {
		t.Errorf("--data=%s is not a mounted volume", g.flags["data"])
	}
	for name, p := range map[string]*corev1.Probe{"liveness": g.container.LivenessProbe, "readiness": g.container.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" || p.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe %+v, want GET /health on port http", name, p)
		}
	}
	if len(g.container.Ports) != 1 || g.container.Ports[0].Name != "http" || !strings.HasSuffix(g.flags["listen"], ":"+strconv.Itoa(int(g.container.Ports[0].ContainerPort))) {
		t.Errorf("ports %+v with --listen=%s, want port http where serve listens", g.container.Ports, g.flags["listen"])
	}
	if g.dep.Spec.Template.Annotations["checksum/flags"] == "" {
		t.Error("no checksum/flags annotation: a change of the flags would not roll the gateway")
	}
	if !selects(g.dep.Spec.Selector.MatchLabels, g.dep.Spec.Template.Labels) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", g.dep.Spec.Selector.MatchLabels, g.dep.Spec.Template.Labels)
	}
	svc := one[corev1.Service](t, m, "Service")
	if !selects(svc.Spec.Selector, g.dep.Spec.Template.Labels) {
		t.Errorf("Service selects %v, not the gateway pods %v", svc.Spec.Selector, g.dep.Spec.Template.Labels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service ports %+v, want one to port http", svc.Spec.Ports)
	}
	sa := g.dep.Spec.Template.Spec.ServiceAccountName
	if byName[corev1.ServiceAccount](m, "ServiceAccount", sa) == nil {
		t.Errorf("the gateway runs as ServiceAccount %q, which is not rendered", sa)
	}
}

// checkRBAC checks that the gateway's ServiceAccount may manage pods in
// the engine namespace and hold a Lease in its own.
func checkRBAC(t *testing.T, m manifest, g gateway) {
	t.Helper()
	gatewayNs := g.dep.Namespace
	engineNs := g.flags["kube-namespace"]
	if engineNs == "" {
		engineNs = gatewayNs
	}
	sa := g.dep.Spec.Template.Spec.ServiceAccountName
	for _, need := range []struct {
		ns, group, resource string
		verbs               []string
	}{
		{engineNs, "", "pods", []string{"create", "delete", "get", "list", "watch", "patch", "update"}},
		{engineNs, "", "pods/log", []string{"get"}},
		{gatewayNs, "coordination.k8s.io", "leases", []string{"get", "create", "update", "list", "watch"}},
		{gatewayNs, "", "events", []string{"create"}},
	} {
		for _, verb := range need.verbs {
			if !allowed(m, sa, gatewayNs, need.ns, need.group, need.resource, verb) {
				t.Errorf("ServiceAccount %s/%s may not %s %s in %s", gatewayNs, sa, verb, need.resource, need.ns)
			}
		}
	}
}

// allowed reports whether a Role bound to ServiceAccount saNs/sa in ns
// allows verb on group/resource.
func allowed(m manifest, sa, saNs, ns, group, resource, verb string) bool {
	for _, rb := range all[rbacv1.RoleBinding](m, "RoleBinding") {
		if rb.Namespace != ns || rb.RoleRef.Kind != "Role" || !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == saNs
		}) {
			continue
		}
		for _, role := range all[rbacv1.Role](m, "Role") {
			if role.Namespace != ns || role.Name != rb.RoleRef.Name {
				continue
			}
			for _, r := range role.Rules {
				if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
					return true
				}
			}
		}
	}
	return false
}

// checkPriorityClasses checks that the classes the engines are given
// exist (when the chart makes them) and order interactive above batch.
func checkPriorityClasses(t *testing.T, m manifest, g gateway) {
	t.Helper()
	pcs := all[schedulingv1.PriorityClass](m, "PriorityClass")
	if len(pcs) == 0 {
		return // priorityClasses.create: false
	}
	interactive := byName[schedulingv1.PriorityClass](m, "PriorityClass", g.flags["kube-priority-class-interactive"])
	batch := byName[schedulingv1.PriorityClass](m, "PriorityClass", g.flags["kube-priority-class-batch"])
	if interactive == nil || batch == nil {
		t.Fatalf("PriorityClasses %q and %q named by the flags are not both rendered", g.flags["kube-priority-class-interactive"], g.flags["kube-priority-class-batch"])
	}
	if interactive.Value <= batch.Value {
		t.Errorf("interactive priority %d, batch %d: want interactive above batch", interactive.Value, batch.Value)
	}
	if p := interactive.PreemptionPolicy; p == nil || *p != corev1.PreemptLowerPriority {
		t.Errorf("interactive preemptionPolicy %v, want PreemptLowerPriority", p)
	}
	if p := batch.PreemptionPolicy; p == nil || *p != corev1.PreemptNever {
		t.Errorf("batch preemptionPolicy %v, want Never", p)
	}
	for _, pc := range pcs {
		if pc.GlobalDefault {
			t.Errorf("PriorityClass %s is the cluster's global default", pc.Name)
		}
	}
}

// checkNoSecretInConfigMaps checks that no value of a rendered Secret,
// nor any of secrets, is in a ConfigMap or written into the Deployment.
func checkNoSecretInConfigMaps(t *testing.T, m manifest, secrets []string) {
	t.Helper()
	secrets = slices.Clone(secrets)
	for _, s := range all[corev1.Secret](m, "Secret") {
		for _, v := range s.Data {
			secrets = append(secrets, string(v))
		}
	}
	for _, o := range m {
		if o.Kind != "ConfigMap" && o.Kind != "Deployment" {
			continue
		}
		for _, s := range secrets {
			if s != "" && strings.Contains(o.YAML, s) {
				t.Errorf("%s %s holds the secret %q", o.Kind, o.Name, s)
			}
		}
	}
}

// selects reports whether selector matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Errorf("not JSON: %v", err)
		return false
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Errorf("not JSON: %v", err)
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// TestServeTakesTheChartsFlags runs the real `stoke serve` with the
// arguments each value set gives the gateway (and --help, so that it
// parses them and stops): every flag exists and every value parses.
func TestServeTakesTheChartsFlags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "stoke")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/stoke").CombinedOutput(); err != nil {
		t.Fatalf("go build stoke: %v\n%s", err, out)
	}
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			m, err := render(t, "stoke", vs.values)
			if err != nil {
				t.Fatal(err)
			}
			g := gatewayOf(t, m)
			out, err := exec.Command(bin, append(g.args, "--help")...).CombinedOutput()
			if err != nil {
				t.Fatalf("stoke %s --help: %v\n%s", strings.Join(g.args, " "), err, out)
			}
		})
	}
}
