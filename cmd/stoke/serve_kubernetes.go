package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/stokehq/stoke/runtime"
	kuberuntime "github.com/stokehq/stoke/runtime/kubernetes"
)

// kubeFlags configure --runtime kubernetes: engine runtimes as pods.
type kubeFlags struct {
	kubeconfig, namespace, install, pullPolicy string
	cpu, memory                                string
	gpus                                       int
	nodeSelector, spotNodeSelector             map[string]string
	tolerations, spotTolerations               []string
	priorityInteractive, priorityBatch         string
	cachePath, s3Secret                        string
}

func (k *kubeFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster, with --runtime kubernetes or --leader-elect (default: in-cluster, else $KUBECONFIG)")
	fl.StringVar(&k.namespace, "kube-namespace", "", "namespace of the engine pods and the leader Lease (default: this pod's namespace, else default)")
	fl.StringVar(&k.install, "kube-install", "stoke", "name of this install, on its engine pods' stoke.dev/install label: a gateway adopts only its install's pods")
	fl.StringVar(&k.pullPolicy, "kube-image-pull-policy", string(corev1.PullIfNotPresent), "the engine pods' imagePullPolicy: Always, IfNotPresent or Never")
	fl.StringVar(&k.cpu, "kube-engine-cpu", "2", "CPU of every engine pod (requests = limits; 0: none)")
	fl.StringVar(&k.memory, "kube-engine-memory", "4Gi", "memory of every engine pod (requests = limits; 0: none)")
	fl.IntVar(&k.gpus, "kube-engine-gpus", 0, "nvidia.com/gpu of every engine pod")
	fl.StringToStringVar(&k.nodeSelector, "kube-node-selector", nil, "node selector of on-demand engine pods (k=v,…)")
	fl.StringSliceVar(&k.tolerations, "kube-tolerations", nil, "tolerations of on-demand engine pods (key=value:Effect or key:Effect, …)")
	fl.StringToStringVar(&k.spotNodeSelector, "kube-spot-node-selector", nil, "node selector of spot engine pods (k=v,…)")
	fl.StringSliceVar(&k.spotTolerations, "kube-spot-tolerations", nil, "tolerations of spot engine pods (key=value:Effect or key:Effect, …)")
	fl.StringVar(&k.priorityInteractive, "kube-priority-class-interactive", "", "PriorityClass of on-demand engine pods (the chart's stoke-interactive)")
	fl.StringVar(&k.priorityBatch, "kube-priority-class-batch", "", "PriorityClass of spot engine pods, preempted first (the chart's stoke-batch)")
	fl.StringVar(&k.s3Secret, "kube-s3-secret", "", "Secret (in --kube-namespace) whose keys give the engine pods AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: NAME, or NAME:ID_KEY:SECRET_KEY (default: this process's AWS_* environment, written into the pod spec)")
	fl.StringVar(&k.cachePath, "kube-cache-path", "", "node-local directory (hostPath) of the engines' node cache (default: none, every load reads the bucket)")
}

// restConfig is the cluster's client configuration: --kubeconfig, else
// in-cluster, else $KUBECONFIG.
func (k *kubeFlags) restConfig() (*rest.Config, error) {
	if k.kubeconfig == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if k.kubeconfig != "" {
		rules.ExplicitPath = k.kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	return cfg, nil
}

// ns is the namespace of the pods and the Lease.
func (k *kubeFlags) ns() string {
	if k.namespace != "" {
		return k.namespace
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(b) > 0 {
		return strings.TrimSpace(string(b))
	}
	return "default"
}

// options are the kubernetes backend's options from the flags.
func (k *kubeFlags) options(client kubernetes.Interface, image string, hostPaths []string) (kuberuntime.Options, error) {
	o := kuberuntime.Options{Client: client, Namespace: k.ns(), Install: k.install, Image: image, PullPolicy: corev1.PullPolicy(k.pullPolicy),
		GPUs: k.gpus, CachePath: k.cachePath, HostPaths: hostPaths}
	switch o.PullPolicy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return o, fmt.Errorf("--kube-image-pull-policy: %q is not Always, IfNotPresent or Never", k.pullPolicy)
	}
	var err error
	if o.CPU, err = quantity("kube-engine-cpu", k.cpu); err != nil {
		return o, err
	}
	if o.Memory, err = quantity("kube-engine-memory", k.memory); err != nil {
		return o, err
	}
	if k.gpus < 0 {
		return o, fmt.Errorf("--kube-engine-gpus: %d is negative", k.gpus)
	}
	onDemand, err := tolerations("kube-tolerations", k.tolerations)
	if err != nil {
		return o, err
	}
	spot, err := tolerations("kube-spot-tolerations", k.spotTolerations)
	if err != nil {
		return o, err
	}
	o.Pools = map[runtime.Class]kuberuntime.Pool{
		runtime.OnDemand: {NodeSelector: k.nodeSelector, Tolerations: onDemand, PriorityClass: k.priorityInteractive},
		runtime.Spot:     {NodeSelector: k.spotNodeSelector, Tolerations: spot, PriorityClass: k.priorityBatch},
	}
	fromSecret := map[string]bool{}
	if k.s3Secret != "" {
		parts := strings.Split(k.s3Secret, ":")
		if len(parts) == 1 {
			parts = append(parts, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
		}
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return o, fmt.Errorf("--kube-s3-secret: %q is not NAME or NAME:ID_KEY:SECRET_KEY", k.s3Secret)
		}
		for i, env := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
			o.Env = append(o.Env, corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: parts[0]}, Key: parts[i+1]}}})
			fromSecret[env] = true
		}
	}
	for _, kv := range os.Environ() {
		if name, value, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(name, "AWS_") && !fromSecret[name] {
			o.Env = append(o.Env, corev1.EnvVar{Name: name, Value: value})
		}
	}
	return o, nil
}

// openKubernetes is the kubernetes backend of --runtime kubernetes.
func (k *kubeFlags) openKubernetes(ctx context.Context, image string, hostPaths []string) (*kuberuntime.Backend, error) {
	cfg, err := k.restConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	o, err := k.options(client, image, hostPaths)
	if err != nil {
		return nil, err
	}
	return kuberuntime.New(ctx, o)
}

// quantity parses a resource quantity flag ("0" is none).
func quantity(flag, s string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return q, fmt.Errorf("--%s: %q is not a quantity (2, 500m, 4Gi): %w", flag, s, err)
	}
	if q.Sign() < 0 {
		return q, fmt.Errorf("--%s: %s is negative", flag, s)
	}
	return q, nil
}

// tolerations parses key=value:Effect (Equal) and key:Effect (Exists).
func tolerations(flag string, specs []string) ([]corev1.Toleration, error) {
	var out []corev1.Toleration
	for _, s := range specs {
		kv, effect, ok := strings.Cut(s, ":")
		if !ok || kv == "" {
			return nil, fmt.Errorf("--%s: %q is not key=value:Effect or key:Effect", flag, s)
		}
		t := corev1.Toleration{Effect: corev1.TaintEffect(effect), Operator: corev1.TolerationOpExists}
		switch t.Effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return nil, fmt.Errorf("--%s: effect %q is not NoSchedule, PreferNoSchedule or NoExecute", flag, effect)
		}
		t.Key = kv
		if key, value, ok := strings.Cut(kv, "="); ok {
			t.Key, t.Value, t.Operator = key, value, corev1.TolerationOpEqual
		}
		out = append(out, t)
	}
	return out, nil
}
