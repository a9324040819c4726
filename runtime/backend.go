package runtime

import (
	"context"
	"time"
)

// Spec says how to start one engine runtime.
type Spec struct {
	// ID names the runtime; backends use it for their records.
	ID string
	// Socket is the unix socket path the engine listens on.
	Socket string
	// EngineArgs are the `stoke engine --blank` flags beyond --listen
	// (KV cache, weight arena, node cache, threads).
	EngineArgs []string
	// MemoryBytes and CPUs limit the runtime where the backend can (0: no
	// limit).
	MemoryBytes int64
	CPUs        float64
	// Class is the capacity class of the runtime's slot: where a backend
	// with node pools places it (on-demand or spot nodes).
	Class Class
}

// Backend starts engine runtimes: processes, containers.
type Backend interface {
	// Name is "process", "containerd" or "kubernetes".
	Name() string
	// Start launches a runtime; it returns once the runtime is launched,
	// not once it serves.
	Start(ctx context.Context, spec Spec) (Process, error)
	// Recover returns the runtimes an earlier manager left running, and
	// removes what dead ones left behind.
	Recover(ctx context.Context) ([]Process, error)
}

// Process is a launched runtime.
type Process interface {
	// ID is the Spec's ID.
	ID() string
	// Addr is where the engine listens, as engineapi.Dial takes it:
	// "unix:///path.sock" or "host:port"; "" while the backend does not
	// know it yet (a pod not yet running).
	Addr() string
	// Done is closed when the runtime has exited.
	Done() <-chan struct{}
	// Stop asks the runtime to drain and exit (SIGTERM), kills it after
	// grace, waits until it is gone and removes its leftovers.
	Stop(ctx context.Context, grace time.Duration) error
}
