package activator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
)

func TestAdapterSetAffinity(t *testing.T) {
	cases := []struct {
		name    string
		routed  []string // requests routed, in order
		answers []bool   // how each ended (ok), in the same order; shorter: still in flight
		slots   int
		want    map[string]int
	}{
		{"empty: a free slot", nil, nil, 2, map[string]int{"a": adapterFree}},
		{"in flight: loading", []string{"a"}, nil, 2, map[string]int{"a": adapterLoading, "b": adapterFree}},
		{"answered: loaded", []string{"a"}, []bool{true}, 2, map[string]int{"a": adapterLoaded, "b": adapterFree}},
		{"failed: not loaded", []string{"a"}, []bool{false}, 2, map[string]int{"a": adapterFree}},
		{"full: none", []string{"a", "b"}, []bool{true, true}, 2, map[string]int{"a": adapterLoaded, "b": adapterLoaded, "c": adapterNone}},
		{"loading takes a slot", []string{"a", "b"}, []bool{true}, 2, map[string]int{"b": adapterLoading, "c": adapterNone}},
		{"LRU evicts the oldest", []string{"a", "b", "c"}, []bool{true, true, true}, 2, map[string]int{"a": adapterNone, "b": adapterLoaded, "c": adapterLoaded}},
		{"a use refreshes", []string{"a", "b", "a", "c"}, []bool{true, true, true, true}, 2, map[string]int{"a": adapterLoaded, "b": adapterNone, "c": adapterLoaded}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s adapterSet
			for i, a := range tc.routed {
				s.routed(a)
				if i < len(tc.answers) {
					s.answered(a, tc.answers[i], tc.slots)
				}
			}
			for a, want := range tc.want {
				if got := s.affinity(a, tc.slots); got != want {
					t.Errorf("affinity(%s) = %d, want %d (lru %v, loading %v)", a, got, want, s.lru, s.loading)
				}
			}
		})
	}
}

// TestPoolAdapterAffinity routes adapters over a pool of replicas and
// checks each pick against what the pool was told: loaded first, then a
// free slot, then loading; never past the load slack.
func TestPoolAdapterAffinity(t *testing.T) {
	p := NewPool(PoolOptions{AdapterSlots: 2, Seed: 3, Prefix: PrefixOptions{Disabled: true}})
	for _, id := range []string{"r0", "r1", "r2"} {
		if err := p.Add(id, 0); err != nil {
			t.Fatal(err)
		}
	}
	pick := func(adapter string) (string, ReleaseFunc) {
		t.Helper()
		id, release, room := p.PickAdapter("", adapter, nil)
		if room != RoomTaken {
			t.Fatalf("pick %s: room %v", adapter, room)
		}
		return id, release
	}
	// Load a0 and a1 on whichever replica takes them, and remember where.
	where := map[string]string{}
	for _, a := range []string{"a0", "a1", "a2", "a3"} {
		id, release := pick(a)
		release(nil)
		where[a] = id
	}
	// Every later request of a loaded adapter goes back to its replica
	// while the load is even.
	for i := range 40 {
		a := fmt.Sprintf("a%d", i%4)
		id, release := pick(a)
		release(nil)
		if id != where[a] {
			t.Fatalf("request %d for %s went to %s, but %s holds it", i, a, id, where[a])
		}
	}
	// A new adapter goes to a replica with a free slot: six slots, four
	// loaded, so one replica at least has room.
	free := map[string]bool{}
	for _, id := range []string{"r0", "r1", "r2"} {
		n := 0
		for _, at := range where {
			if at == id {
				n++
			}
		}
		free[id] = n < 2
	}
	id, release := pick("a4")
	if !free[id] {
		t.Fatalf("new adapter went to %s, which has no free slot (placement %v)", id, where)
	}
	// While a4 loads there, a second a4 request joins it.
	id2, release2 := pick("a4")
	if id2 != id {
		t.Fatalf("second a4 request went to %s, not to %s where it is loading", id2, id)
	}
	release(nil)
	release2(errors.New("engine failed"))

	// Load beats affinity past the slack: a0 requests that stay in
	// flight pile on a0's replica only up to the slack, then go elsewhere.
	home, slack := where["a0"], p.prefix.slack(0)
	var held []ReleaseFunc
	away := 0
	for range 3 * (slack + 2) {
		id, r := pick("a0")
		held = append(held, r)
		if id != home {
			away++
		}
		most, least := 0, 1<<30
		for _, id := range []string{"r0", "r1", "r2"} {
			most, least = max(most, p.InFlight(id)), min(least, p.InFlight(id))
		}
		if most-least > slack+1 {
			t.Fatalf("in flight spread %d..%d exceeds the slack %d", least, most, slack)
		}
	}
	if away == 0 {
		t.Fatalf("all %d a0 requests in flight went to %s", len(held), home)
	}
	for _, r := range held {
		r(nil)
	}
}

// adapterResolver is testResolver with adapters of model m.
type adapterResolver struct {
	testResolver
	adapters map[string]engineapi.LoadAdapterRequest
}

func (r *adapterResolver) Adapter(deployment, name string) (engineapi.LoadAdapterRequest, bool) {
	ad, ok := r.adapters[name]
	return ad, ok && deployment == "m"
}

// TestServeAdapters: a request for m:ADAPTER is served by m's replicas,
// each told of the adapter once before its first such request; an unknown
// adapter is a 404, and an adapter the engine refuses is the engine's 4xx
// for the client.
func TestServeAdapters(t *testing.T) {
	res := &adapterResolver{testResolver: testResolver{spec: config.Default()}, adapters: map[string]engineapi.LoadAdapterRequest{
		"sql": {Name: "sql", Path: "s3://b/m/adapters/sql", Revision: "sha256:1"},
		"bad": {Name: "bad", Path: "s3://b/m/adapters/bad", Revision: "sha256:2"},
	}}
	a := New(Options{Resolver: res})
	ts := httptest.NewServer(a)
	defer ts.Close()
	var mu sync.Mutex
	registered := map[string]int{} // adapter → registrations
	var models []string
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/admin/adapters":
			var req engineapi.LoadAdapterRequest
			if err := json.Unmarshal(body, &req); err != nil {
				t.Errorf("registration body %s: %v", body, err)
			}
			if req.Name == "bad" {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprint(w, `{"error":{"message":"tensor x has shape [1 2], want [4 2]","type":"invalid_request_error"}}`)
				return
			}
			mu.Lock()
			registered[req.Path+"@"+req.Revision]++
			mu.Unlock()
			fmt.Fprint(w, `{}`)
		default:
			var ir inferenceRequest
			json.Unmarshal(body, &ir)
			mu.Lock()
			models = append(models, ir.Model)
			mu.Unlock()
			fmt.Fprint(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}
	}))
	defer engine.Close()
	a.AddReplica("m", "r0", strings.TrimPrefix(engine.URL, "http://"), 0)

	for i := range 3 {
		if resp, body := post(t, ts.URL, `{"model":"m:sql","prompt":"x"}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	mu.Lock()
	if n := registered["s3://b/m/adapters/sql@sha256:1"]; n != 1 {
		t.Fatalf("the adapter was registered %d times, want once: %v", n, registered)
	}
	if !slices.Equal(models, []string{"m:sql", "m:sql", "m:sql"}) {
		t.Fatalf("the engine saw models %v", models)
	}
	mu.Unlock()

	resp, body := post(t, ts.URL, `{"model":"m:nope","prompt":"x"}`)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Fatalf("unknown adapter: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, ts.URL, `{"model":"m:bad","prompt":"x"}`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "adapter_invalid") || !strings.Contains(body, "has shape") {
		t.Fatalf("refused adapter: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Stoke-Replica") != "" {
		t.Fatalf("a refused adapter's answer names replica %s", resp.Header.Get("X-Stoke-Replica"))
	}
	// The replica is whole after the refusal: its slot was given back.
	if n := a.InFlight("m", "r0"); n != 0 {
		t.Fatalf("%d requests still in flight on r0", n)
	}

	// A route may send requests to an adapter.
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	routes := config.Routes{Routes: []config.Route{{Name: "sql-route", Split: []config.Weighted{{To: "m:sql", Weight: 1}}}}}
	if _, err := NewRouteBook(context.Background(), a, st, routes, nil); err != nil {
		t.Fatal(err)
	}
	if resp, body := post(t, ts.URL, `{"model":"sql-route","prompt":"x"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("through a route: %d %s", resp.StatusCode, body)
	}
	mu.Lock()
	if got := models[len(models)-1]; got != "m:sql" {
		t.Fatalf("a routed request reached the engine as %q", got)
	}
	mu.Unlock()

	// A replica that comes back (removed, added again) is told again.
	a.RemoveReplica(context.Background(), "m", "r0")
	a.AddReplica("m", "r0", strings.TrimPrefix(engine.URL, "http://"), 0)
	if resp, body := post(t, ts.URL, `{"model":"m:sql","prompt":"x"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("after re-adding: %d %s", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := registered["s3://b/m/adapters/sql@sha256:1"]; n != 2 {
		t.Fatalf("registrations after the replica came back: %d, want 2", n)
	}
}

// TestServeSpeculativeDefault: a deployment with speculative: false has
// its requests reach the engine with "speculative": false unless they
// ask for it; the default spec passes bodies through untouched.
func TestServeSpeculativeDefault(t *testing.T) {
	for _, tc := range []struct {
		name        string
		speculative bool
		body, want  string
	}{
		{"default passes through", true, `{"model":"m","prompt":"x"}`, `{"model":"m","prompt":"x"}`},
		{"off by the deployment", false, `{"model":"m","prompt":"x"}`, `{"speculative":false,"model":"m","prompt":"x"}`},
		{"the request decides", false, `{"model":"m","prompt":"x","speculative":true}`, `{"model":"m","prompt":"x","speculative":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := config.Default()
			spec.Speculative = tc.speculative
			a, ts, _ := newTestActivator(t, spec)
			seen := make(chan string, 1)
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				seen <- string(body)
				fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
			}))
			defer engine.Close()
			a.AddReplica("m", "r0", strings.TrimPrefix(engine.URL, "http://"), 0)
			if resp, body := post(t, ts.URL, tc.body); resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if got := <-seen; got != tc.want {
				t.Fatalf("the engine got %s, want %s", got, tc.want)
			}
		})
	}
}

// TestServeAdapterNewRevision: when an adapter gets a new revision, an
// engine holding the old one under its name (409) has it swapped (DELETE,
// then POST) once no request uses it; until then it serves the old one.
func TestServeAdapterNewRevision(t *testing.T) {
	res := &adapterResolver{testResolver: testResolver{spec: config.Default()}, adapters: map[string]engineapi.LoadAdapterRequest{
		"sql": {Name: "sql", Path: "s3://b/m/adapters/sql", Revision: "sha256:1"},
	}}
	a := New(Options{Resolver: res})
	ts := httptest.NewServer(a)
	defer ts.Close()
	var mu sync.Mutex
	held := map[string]string{} // name → revision, as the engine's pool
	busy := true                // the adapter has requests: an unload is refused
	var calls []string
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/admin/adapters":
			var req engineapi.LoadAdapterRequest
			json.Unmarshal(body, &req)
			calls = append(calls, "post "+req.Revision)
			if rev, ok := held[req.Name]; ok && rev != req.Revision {
				w.WriteHeader(http.StatusConflict)
				fmt.Fprint(w, `{"error":{"message":"sql is taken; unload it first","type":"invalid_request_error"}}`)
				return
			}
			held[req.Name] = req.Revision
			fmt.Fprint(w, `{}`)
		case r.Method == http.MethodDelete && r.URL.Path == "/admin/adapters/sql":
			calls = append(calls, "delete")
			if busy {
				w.WriteHeader(http.StatusConflict)
				fmt.Fprint(w, `{"error":{"message":"sql is in use","type":"invalid_request_error"}}`)
				return
			}
			delete(held, "sql")
			fmt.Fprint(w, `{}`)
		default:
			fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
		}
	}))
	defer engine.Close()
	a.AddReplica("m", "r0", strings.TrimPrefix(engine.URL, "http://"), 0)
	request := func() {
		t.Helper()
		if resp, body := post(t, ts.URL, `{"model":"m:sql","prompt":"x"}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	request()
	res.adapters = map[string]engineapi.LoadAdapterRequest{"sql": {Name: "sql", Path: "s3://b/m/adapters/sql", Revision: "sha256:2"}}
	request() // busy: served with the revision the engine has
	mu.Lock()
	if held["sql"] != "sha256:1" {
		t.Fatalf("the engine holds %s while busy", held["sql"])
	}
	busy = false
	mu.Unlock()
	request() // now swapped
	request() // and known: no more calls
	mu.Lock()
	defer mu.Unlock()
	if held["sql"] != "sha256:2" {
		t.Fatalf("the engine holds %s, want the new revision", held["sql"])
	}
	want := []string{"post sha256:1", "post sha256:2", "delete", "post sha256:2", "delete", "post sha256:2"}
	if !slices.Equal(calls, want) {
		t.Fatalf("engine calls %v, want %v", calls, want)
	}
}
