package activator

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrPreempted is the cause of a batch request cut short because its
// capacity was taken back; the request's error wraps it in a *Preempted
// that says why. A preempted request was not answered: its caller runs it
// again.
var ErrPreempted = errors.New("preempted")

// Reasons a batch request is preempted.
const (
	// PreemptInteractive: an interactive request was waiting for the
	// replica's room.
	PreemptInteractive = "interactive"
	// PreemptSpot: the replica's spot capacity is being reclaimed.
	PreemptSpot = "spot"
)

// Preempted is the error of a preempted batch request.
type Preempted struct {
	// Reason is why: PreemptInteractive or PreemptSpot.
	Reason string
}

func (p *Preempted) Error() string { return "preempted: " + p.Reason }

// Unwrap makes a *Preempted match ErrPreempted.
func (p *Preempted) Unwrap() error { return ErrPreempted }

// IsBatch reports whether priority is in the batch band (below every
// interactive request): such requests are the ones preempted.
func IsBatch(priority int) bool { return priority < PriorityInteractiveMin }

// batchRequest is a batch request holding room on a replica.
type batchRequest struct {
	replica string
	started time.Time
	cancel  context.CancelCauseFunc
}

// batchSet is the batch requests on a deployment's replicas, which
// interactive demand or a spot drain may cancel.
type batchSet struct {
	mu  sync.Mutex
	set map[*batchRequest]struct{}
}

func (s *batchSet) add(b *batchRequest) {
	s.mu.Lock()
	if s.set == nil {
		s.set = map[*batchRequest]struct{}{}
	}
	s.set[b] = struct{}{}
	s.mu.Unlock()
}

func (s *batchSet) remove(b *batchRequest) {
	s.mu.Lock()
	delete(s.set, b)
	s.mu.Unlock()
}

// preemptNewest cancels the batch request that started last (the one with
// the least work to lose) and reports whether there was one.
func (s *batchSet) preemptNewest(reason string) bool {
	s.mu.Lock()
	var newest *batchRequest
	for b := range s.set {
		if newest == nil || b.started.After(newest.started) {
			newest = b
		}
	}
	if newest != nil {
		delete(s.set, newest)
	}
	s.mu.Unlock()
	if newest == nil {
		return false
	}
	newest.cancel(&Preempted{Reason: reason})
	return true
}

// preemptOn cancels every batch request on replica ("" for all replicas)
// and returns how many there were.
func (s *batchSet) preemptOn(replica, reason string) int {
	s.mu.Lock()
	var victims []*batchRequest
	for b := range s.set {
		if replica == "" || b.replica == replica {
			victims = append(victims, b)
			delete(s.set, b)
		}
	}
	s.mu.Unlock()
	for _, b := range victims {
		b.cancel(&Preempted{Reason: reason})
	}
	return len(victims)
}

// PreemptBatch cancels the batch requests running on one replica of a
// deployment (every replica when replicaID is "") with reason, and returns
// how many it cancelled. Their callers see an error wrapping ErrPreempted
// and run them again; interactive requests on the replica are untouched.
func (a *Activator) PreemptBatch(deployment, replicaID, reason string) int {
	r, ok := a.existing(deployment)
	if !ok {
		return 0
	}
	return r.batch.preemptOn(replicaID, reason)
}
