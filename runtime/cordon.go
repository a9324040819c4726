package runtime

import "fmt"

// ErrCordoned is the error of an acquisition whose runtime's slot was
// cordoned before it was handed out. It wraps ErrNoCapacity: the node's
// capacity was taken back, the revision did nothing wrong.
var ErrCordoned = fmt.Errorf("its slot was cordoned: %w", ErrNoCapacity)

// Cordon takes the slots of class out of service, as when a spot
// interruption notice says that capacity goes away: no runtime starts
// there any more, for an acquisition or the warm pool; no idle runtime
// there is handed out, and those that are idle now (starting, blank,
// sleeping, or ready and unclaimed) are stopped, the warm pool refilling
// on the other slots. Replicas acquired there keep serving until they are
// released, and Release stops them, leaving their slot empty. Runtimes
// lists the runtimes of such slots as Cordoned. Cordoning a class again
// does nothing.
func (m *Manager) Cordon(class Class) {
	m.mu.Lock()
	if m.cordoned[class] || m.closed {
		m.mu.Unlock()
		return
	}
	m.cordoned[class] = true
	slots := 0
	for _, c := range m.opts.Slots {
		if c == class {
			slots++
		}
	}
	var idle []*runtimeState
	inUse := 0
	for _, r := range m.runtimes {
		switch {
		case m.opts.Slots[r.slot] != class:
		case r.inUse:
			inUse++
		default:
			r.inUse = true // nobody claims it while it stops
			idle = append(idle, r)
		}
	}
	m.mu.Unlock()
	m.log.Warn("cordoned slots", "class", class, "slots", slots, "idle_runtimes_stopped", len(idle), "replicas_serving_on", inUse)
	for _, r := range idle {
		go m.markGone(r, fmt.Sprintf("idle in a cordoned %s slot", class))
	}
}

// cordonedLocked reports whether slot's class is cordoned; m.mu is held.
func (m *Manager) cordonedLocked(slot int) bool { return m.cordoned[m.opts.Slots[slot]] }

// isCordoned reports whether r's slot is cordoned.
func (m *Manager) isCordoned(r *runtimeState) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cordonedLocked(r.slot)
}

// freeSlotLocked returns the first free slot that is not cordoned, or -1;
// m.mu is held. Every runtime that starts gets its slot from it.
func (m *Manager) freeSlotLocked() int {
	for slot, id := range m.slots {
		if id == "" && !m.cordonedLocked(slot) {
			return slot
		}
	}
	return -1
}
