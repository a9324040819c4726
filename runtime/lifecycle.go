package runtime

import "fmt"

// State is a runtime's lifecycle state.
type State string

// The runtime states. A runtime moves only along the edges canMove allows:
//
//	starting → blank ⇄ loading → ready ⇄ sleeping
//	                   loading → blank (a failed load)
//	ready, sleeping → draining → blank
//	any state → gone (it died, failed its health checks, or was stopped)
const (
	StateStarting State = "starting"
	StateBlank    State = "blank"
	StateLoading  State = "loading"
	StateReady    State = "ready"
	StateSleeping State = "sleeping"
	StateDraining State = "draining"
	// StateGone is a runtime that died, stopped answering or was stopped;
	// its slot is free.
	StateGone State = "gone"
)

// canMove reports whether a runtime in state from may move to state to:
// the one table of the runtime lifecycle.
func canMove(from, to State) bool {
	if to == StateGone {
		return from != StateGone
	}
	switch from {
	case StateStarting:
		return to == StateBlank
	case StateBlank:
		return to == StateLoading
	case StateLoading:
		return to == StateReady || to == StateBlank
	case StateReady:
		return to == StateSleeping || to == StateDraining
	case StateSleeping:
		return to == StateReady || to == StateDraining
	case StateDraining:
		return to == StateBlank
	}
	return false
}

// errMove is the error of a transition canMove refuses.
func errMove(id string, from, to State) error {
	return fmt.Errorf("runtime %s: no transition from %s to %s", id, from, to)
}
