// Package kubernetes is the Kubernetes runtime backend: an engine runtime
// is a Pod of the engine image, listening on a TCP port of the pod's IP,
// placed by the slot's class on the on-demand or the spot node pool (node
// selector, tolerations) with the class's PriorityClass, so that the
// scheduler preempts batch pods for interactive ones. The backend watches
// its pods through a client-go informer (no polling): a pod deleted,
// evicted or failed is a runtime gone. A restarted gateway re-adopts the
// running pods of its install by their labels and deletes the others.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/stokehq/stoke/runtime"
)

// Labels the backend puts on its pods.
const (
	// LabelRuntime marks a stoke engine runtime pod; its value is the
	// runtime's id.
	LabelRuntime = "stoke.dev/runtime"
	// LabelInstall names the install (gateway) that owns the pod, so two
	// installs in one namespace never adopt each other's pods.
	LabelInstall = "stoke.dev/install"
	// LabelClass is the capacity class of the pod's slot.
	LabelClass = "stoke.dev/class"
)

// DefaultPort is the engine's TCP port in its pod.
const DefaultPort = 8000

// Pool is where the pods of one capacity class go.
type Pool struct {
	// NodeSelector and Tolerations place the pods on the pool's nodes.
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	// PriorityClass is the pods' PriorityClassName ("" for none).
	PriorityClass string
}

// Options configure the backend.
type Options struct {
	// Client talks to the API server; Namespace is where the pods live.
	Client    kubernetes.Interface
	Namespace string
	// Install names this install (label stoke.dev/install; default
	// "stoke").
	Install string
	// Image is the engine image; PullPolicy its pull policy (default
	// IfNotPresent).
	Image      string
	PullPolicy corev1.PullPolicy
	// Port is the engine's port in the pod (default DefaultPort).
	Port int
	// CPU, Memory and GPUs are every pod's resources (requests equal
	// limits; zero: none; GPUs as nvidia.com/gpu). A Spec's CPUs and
	// MemoryBytes, when set, win.
	CPU    resource.Quantity
	Memory resource.Quantity
	GPUs   int
	// Pools place the pods of each class; a class without a pool gets no
	// placement.
	Pools map[runtime.Class]Pool
	// CachePath, when set, is a node-local directory (hostPath) mounted at
	// the same path in every pod: the node cache the engines load through.
	CachePath string
	// HostPaths are host directories mounted at the same path in every
	// pod, read-only (a file:// bucket on a one-node cluster).
	HostPaths []string
	// Env is the engines' environment (AWS_* for s3:// buckets).
	Env []corev1.EnvVar
	// Logger receives the backend's logs (slog.Default() when nil).
	Logger *slog.Logger
}

// Backend starts runtimes as pods.
type Backend struct {
	opts     Options
	log      *slog.Logger
	informer cache.SharedIndexInformer
	lister   corelisters.PodNamespaceLister
	stop     chan struct{}

	mu    sync.Mutex
	procs map[string]*pod // by pod name
}

// New returns a backend whose pod informer has synced.
func New(ctx context.Context, o Options) (*Backend, error) {
	switch {
	case o.Client == nil:
		return nil, errors.New("kubernetes backend: Options.Client is required")
	case o.Namespace == "":
		return nil, errors.New("kubernetes backend: Options.Namespace is required")
	case o.Image == "":
		return nil, errors.New("kubernetes backend: Options.Image is required")
	}
	if o.Install == "" {
		o.Install = "stoke"
	}
	if o.PullPolicy == "" {
		o.PullPolicy = corev1.PullIfNotPresent
	}
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	b := &Backend{opts: o, log: o.Logger.With("component", "kubernetes-backend"), stop: make(chan struct{}), procs: map[string]*pod{}}
	selector := labels.Set{LabelInstall: o.Install}.AsSelector().String() + "," + LabelRuntime
	factory := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithNamespace(o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = selector }))
	pods := factory.Core().V1().Pods()
	b.informer, b.lister = pods.Informer(), pods.Lister().Pods(o.Namespace)
	if _, err := b.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { b.observe(obj, false) },
		UpdateFunc: func(_, obj any) { b.observe(obj, false) },
		DeleteFunc: func(obj any) { b.observe(obj, true) },
	}); err != nil {
		return nil, fmt.Errorf("kubernetes backend: watch pods: %w", err)
	}
	factory.Start(b.stop)
	if !cache.WaitForCacheSync(ctx.Done(), b.informer.HasSynced) {
		close(b.stop)
		return nil, fmt.Errorf("kubernetes backend: list pods in %s: %w", o.Namespace, context.Cause(ctx))
	}
	return b, nil
}

// Name implements runtime.Backend.
func (b *Backend) Name() string { return "kubernetes" }

// Close stops watching.
func (b *Backend) Close() error {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	return nil
}

// Start creates the runtime's pod; it returns once the API server has it.
// Its address is known once it runs (Process.Addr is "" until then).
func (b *Backend) Start(ctx context.Context, spec runtime.Spec) (runtime.Process, error) {
	p := b.track(spec.ID)
	created, err := b.opts.Client.CoreV1().Pods(b.opts.Namespace).Create(ctx, b.podFor(spec), metav1.CreateOptions{})
	if err != nil {
		b.untrack(p)
		return nil, fmt.Errorf("kubernetes backend: create pod %s: %w", spec.ID, err)
	}
	b.observe(created, false)
	return p, nil
}

// Recover returns the running pods of this install, and deletes those that
// failed or ended.
func (b *Backend) Recover(ctx context.Context) ([]runtime.Process, error) {
	pods, err := b.lister.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: list pods: %w", err)
	}
	var out []runtime.Process
	for _, po := range pods {
		if po.DeletionTimestamp == nil && po.Status.Phase == corev1.PodRunning && po.Status.PodIP != "" {
			p := b.track(po.Name)
			b.observe(po, false)
			out = append(out, p)
			continue
		}
		b.log.Info("deleting a runtime pod from an earlier run", "pod", po.Name, "phase", po.Status.Phase)
		if err := b.delete(ctx, po.Name, 0); err != nil {
			return out, err
		}
	}
	return out, nil
}

// podFor is the pod of spec.
func (b *Backend) podFor(spec runtime.Spec) *corev1.Pod {
	o := b.opts
	resources := corev1.ResourceList{}
	if !o.CPU.IsZero() {
		resources[corev1.ResourceCPU] = o.CPU
	}
	if !o.Memory.IsZero() {
		resources[corev1.ResourceMemory] = o.Memory
	}
	if spec.CPUs > 0 {
		resources[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(spec.CPUs*1000), resource.DecimalSI)
	}
	if spec.MemoryBytes > 0 {
		resources[corev1.ResourceMemory] = *resource.NewQuantity(spec.MemoryBytes, resource.BinarySI)
	}
	if o.GPUs > 0 {
		resources["nvidia.com/gpu"] = *resource.NewQuantity(int64(o.GPUs), resource.DecimalSI)
	}
	args := append([]string{"engine", "--blank", "--listen", net.JoinHostPort("0.0.0.0", strconv.Itoa(o.Port))}, spec.EngineArgs...)
	container := corev1.Container{
		Name:            "engine",
		Image:           o.Image,
		ImagePullPolicy: o.PullPolicy,
		Args:            args,
		Env:             o.Env,
		Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: int32(o.Port), Protocol: corev1.ProtocolTCP}},
		Resources:       corev1.ResourceRequirements{Requests: resources, Limits: resources},
		// Ready once a model serves: a blank engine answers 503.
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(int32(o.Port))}},
			PeriodSeconds: 2, FailureThreshold: 1,
		},
	}
	var volumes []corev1.Volume
	mount := func(name, path string, readOnly bool) {
		dirType := corev1.HostPathDirectoryOrCreate
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &dirType}}})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: path, ReadOnly: readOnly})
	}
	if o.CachePath != "" {
		mount("node-cache", o.CachePath, false)
	}
	for i, path := range o.HostPaths {
		mount("host-"+strconv.Itoa(i), path, true)
	}
	pool := o.Pools[spec.Class]
	grace := int64(30)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   spec.ID,
			Labels: map[string]string{LabelRuntime: spec.ID, LabelInstall: o.Install, LabelClass: string(spec.Class), "app.kubernetes.io/name": "stoke-engine"},
		},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{container},
			Volumes:                       volumes,
			RestartPolicy:                 corev1.RestartPolicyNever,
			NodeSelector:                  pool.NodeSelector,
			Tolerations:                   pool.Tolerations,
			PriorityClassName:             pool.PriorityClass,
			TerminationGracePeriodSeconds: &grace,
			EnableServiceLinks:            new(false),
			AutomountServiceAccountToken:  new(false),
		},
	}
}

// observe updates the process of a pod the informer (or a create) saw.
func (b *Backend) observe(obj any, deleted bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = t.Obj, true
	}
	po, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	b.mu.Lock()
	p := b.procs[po.Name]
	b.mu.Unlock()
	if p == nil {
		return
	}
	switch {
	case deleted:
		p.end("pod deleted")
		p.removed()
	case po.DeletionTimestamp != nil:
		p.end("pod is being deleted")
	case po.Status.Phase == corev1.PodFailed || po.Status.Phase == corev1.PodSucceeded:
		p.end(fmt.Sprintf("pod %s: %s %s", po.Status.Phase, po.Status.Reason, po.Status.Message))
	case terminated(po):
		p.end("the engine container exited")
	case po.Status.PodIP != "" && po.Status.Phase == corev1.PodRunning:
		p.setAddr(net.JoinHostPort(po.Status.PodIP, strconv.Itoa(b.opts.Port)))
	}
}

// terminated reports whether the pod's engine container has exited.
func terminated(po *corev1.Pod) bool {
	for _, cs := range po.Status.ContainerStatuses {
		if cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

// track returns the process of pod name, recording it.
func (b *Backend) track(name string) *pod {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := &pod{b: b, name: name, done: make(chan struct{}), gone: make(chan struct{})}
	b.procs[name] = p
	return p
}

// untrack forgets p.
func (b *Backend) untrack(p *pod) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.procs[p.name] == p {
		delete(b.procs, p.name)
	}
}

// delete deletes pod name with grace (seconds); a pod already gone is no
// error.
func (b *Backend) delete(ctx context.Context, name string, grace int64) error {
	err := b.opts.Client.CoreV1().Pods(b.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubernetes backend: delete pod %s: %w", name, err)
	}
	return nil
}

// pod is a runtime's pod.
type pod struct {
	b    *Backend
	name string
	// done closes when the runtime ends (its pod fails, exits or is being
	// deleted); gone when the API server no longer has the pod.
	done, gone chan struct{}
	goneOnce   sync.Once

	mu     sync.Mutex
	addr   string
	reason string // why it ended
}

func (p *pod) ID() string            { return p.name }
func (p *pod) Done() <-chan struct{} { return p.done }

// Addr is the pod's IP and the engine's port once the pod runs.
func (p *pod) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

func (p *pod) setAddr(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reason == "" {
		p.addr = addr
	}
}

// end marks the runtime gone, once.
func (p *pod) end(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reason != "" {
		return
	}
	p.reason = reason
	p.b.log.Info("runtime ended", "pod", p.name, "reason", reason)
	close(p.done)
}

// removed records that the API server no longer has the pod.
func (p *pod) removed() {
	p.goneOnce.Do(func() {
		close(p.gone)
		p.b.untrack(p)
	})
}

// Stop deletes the pod with grace for the engine to drain (SIGTERM, then
// SIGKILL from the kubelet) and waits until the informer sees it deleted,
// or ctx ends.
func (p *pod) Stop(ctx context.Context, grace time.Duration) error {
	if err := p.b.delete(ctx, p.name, int64((grace+time.Second-1)/time.Second)); err != nil {
		return err
	}
	select {
	case <-p.gone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("kubernetes backend: stop pod %s: %w", p.name, ctx.Err())
	}
}
