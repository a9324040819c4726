package runtime

import "testing"

func TestCanMove(t *testing.T) {
	states := []State{StateStarting, StateBlank, StateLoading, StateReady, StateSleeping, StateDraining, StateGone}
	allowed := map[[2]State]bool{
		{StateStarting, StateBlank}:    true,
		{StateBlank, StateLoading}:     true,
		{StateLoading, StateReady}:     true,
		{StateLoading, StateBlank}:     true,
		{StateReady, StateSleeping}:    true,
		{StateReady, StateDraining}:    true,
		{StateSleeping, StateReady}:    true,
		{StateSleeping, StateDraining}: true,
		{StateDraining, StateBlank}:    true,
	}
	for _, from := range states {
		if from != StateGone {
			allowed[[2]State{from, StateGone}] = true
		}
	}
	for _, from := range states {
		for _, to := range states {
			if got, want := canMove(from, to), allowed[[2]State{from, to}]; got != want {
				t.Errorf("canMove(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
}

func TestSetStateRefusesIllegalMoves(t *testing.T) {
	var events []Event
	m := &Manager{opts: Options{OnEvent: func(e Event) { events = append(events, e) }}.withDefaults()}
	m.log = m.opts.Logger
	r := &runtimeState{id: "r1", state: StateBlank}
	m.setState(r, StateReady, "m", "") // blank → ready skips loading
	if r.state != StateBlank || len(events) != 0 {
		t.Fatalf("blank → ready: state %s, %d events; want it refused", r.state, len(events))
	}
	m.setState(r, StateLoading, "m", "")
	m.setState(r, StateReady, "m", "")
	if r.state != StateReady || r.model != "m" || len(events) != 2 {
		t.Fatalf("blank → loading → ready: state %s model %q, %d events", r.state, r.model, len(events))
	}
	r.state = StateGone
	m.setState(r, StateBlank, "", "")
	if r.state != StateGone || len(events) != 2 {
		t.Fatalf("gone → blank: state %s, %d events; a gone runtime stays gone", r.state, len(events))
	}
}
