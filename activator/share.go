package activator

import "time"

// DefaultShareWindow is PoolOptions.ShareWindow when unset.
const DefaultShareWindow = 2 * time.Second

// flowShares keeps one flow (a tenant) from taking a deployment's last free
// slots while other flows are active: the buffer's fair order decides who
// is next, but when one flow holds every slot, "next" waits for one of its
// requests to end, a whole answer's time. So a flow at or above its fair
// share of the slots (total ÷ active flows) may take a slot only if, after
// it, one stays free for each other active flow below its share. A flow
// below its share may take any free slot, so no flow is ever held below
// its share, and one alone uses every slot.
//
// A flow is active while it has requests in flight or asked for a slot
// within the window. The shared flow ("") is not counted. Guarded by the
// Pool's lock.
type flowShares struct {
	window int64 // nanoseconds
	flows  map[string]*flowUse
}

// flowUse is one flow's slots in flight and when it last asked for one.
type flowUse struct {
	inflight int
	seen     int64 // unix nanoseconds
}

func newFlowShares(window time.Duration) *flowShares {
	return &flowShares{window: int64(window), flows: map[string]*flowUse{}}
}

// admits marks flow as active at now and reports whether it may take one
// of free slots out of total (total 0: some replica has no limit, and
// shares do not apply).
func (s *flowShares) admits(flow string, free, total int, now int64) bool {
	if flow == "" {
		return true
	}
	own := s.flows[flow]
	if own == nil {
		own = &flowUse{}
		s.flows[flow] = own
	}
	own.seen = now
	if total <= 0 || len(s.flows) < 2 {
		return true
	}
	active := 0
	for id, u := range s.flows {
		if u.inflight == 0 && now-u.seen > s.window {
			delete(s.flows, id)
			continue
		}
		active++
	}
	// own below its share: total/active > own.inflight.
	if active < 2 || own.inflight*active < total {
		return true
	}
	reserve := 0
	for id, u := range s.flows {
		if id != flow && u.inflight*active < total {
			reserve++
		}
	}
	return free-1 >= reserve
}

// took counts a slot taken by flow (after admits let it).
func (s *flowShares) took(flow string) {
	if u := s.flows[flow]; u != nil {
		u.inflight++
	}
}

// released gives flow's slot back.
func (s *flowShares) released(flow string, now int64) {
	if u := s.flows[flow]; u != nil && u.inflight > 0 {
		u.inflight--
		u.seen = now
	}
}
