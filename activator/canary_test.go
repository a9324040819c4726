package activator

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/config"
)

// revisionResolver resolves pool names to fixed revisions.
type revisionResolver map[string]string

func (r revisionResolver) Lookup(name string) (string, config.Spec, bool) {
	rev, ok := r[name]
	spec := config.Default()
	spec.Buffer.Timeout = config.Duration(2 * time.Second)
	return rev, spec, ok
}

func (revisionResolver) Poke(string) {}

func TestCanarySplit(t *testing.T) {
	for _, percent := range []int{0, 1, 10, 50, 99, 100} {
		tab := &canaryTable{byDeployment: map[string]canary{"chat": {pool: "chat@canary", percent: percent}}}
		n := 0
		canaried := 0
		for range 100 { // every draw in [0, 100) once
			draw := n
			if tab.split("chat", func(int) int { return draw }) == "chat@canary" {
				canaried++
			}
			n++
		}
		if canaried != percent {
			t.Errorf("percent %d: %d of 100 draws went to the canary", percent, canaried)
		}
		if got := tab.split("other", func(int) int { return 0 }); got != "other" {
			t.Errorf("a deployment with no canary split to %q", got)
		}
	}
}

// TestServeCanaryAndPinnedRevisions: a canary with all the share serves
// every request to its deployment (under the deployment's model name, with
// its revision named on the answer); a name pinning a revision is served
// by that revision alone, whatever the share; once the canary ends its
// revision is no longer served.
func TestServeCanaryAndPinnedRevisions(t *testing.T) {
	var seen sync.Map
	stable, cand := modelEngine(t, &seen, "stable"), modelEngine(t, &seen, "candidate")
	a := New(Options{Resolver: revisionResolver{"chat": "sha256:old", "chat@canary": "sha256:new", "odd@name": "sha256:odd"}})
	ts := httptest.NewServer(a)
	defer ts.Close()
	a.AddReplica("chat", "s1", engineAddr(stable), 0)
	a.AddReplica("chat@canary", "c1", engineAddr(cand), 0)
	odd := modelEngine(t, &seen, "odd")
	a.AddReplica("odd@name", "o1", engineAddr(odd), 0)
	send := func(model string) (int, http.Header) {
		t.Helper()
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"hi"}`, model)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	expect := func(model, revision, engine string) {
		t.Helper()
		seen.Delete(engine)
		code, h := send(model)
		if code != 200 || h.Get(RevisionHeader) != revision || h.Get(DeploymentHeader) != "chat" {
			t.Fatalf("%s: %d from %s@%s, want 200 from chat@%s", model, code, h.Get(DeploymentHeader), h.Get(RevisionHeader), revision)
		}
		if got, ok := seen.Load(engine); !ok || !strings.HasPrefix(got.(string), "chat ") {
			t.Fatalf("%s: the %s engine saw %v, want model chat", model, engine, got)
		}
	}
	expect("chat", "sha256:old", "stable")
	a.SetCanary("chat", "chat@canary", 100)
	expect("chat", "sha256:new", "candidate")
	expect("chat@sha256:old", "sha256:old", "stable")
	expect("chat@sha256:new", "sha256:new", "candidate")
	if code, _ := send("chat@sha256:other"); code != http.StatusNotFound {
		t.Fatalf("a revision not served: %d, want 404", code)
	}
	if code, _ := send("chat@canary"); code != http.StatusNotFound {
		t.Fatalf("the canary's pool by its own name: %d, want 404", code)
	}
	// A deployment whose name holds the separator is no pin.
	if code, h := send("odd@name"); code != 200 || h.Get(RevisionHeader) != "sha256:odd" {
		t.Fatalf("odd@name: %d from revision %q", code, h.Get(RevisionHeader))
	}
	if got, _ := seen.Load("odd"); got == nil || !strings.HasPrefix(got.(string), "odd@name ") {
		t.Fatalf("odd@name's engine saw %v", got)
	}
	a.SetCanary("chat", "", 0)
	expect("chat", "sha256:old", "stable")
	if code, _ := send("chat@sha256:new"); code != http.StatusNotFound {
		t.Fatalf("the ended canary's revision: %d, want 404", code)
	}
}

// BenchmarkCanaryHealthyPath measures what a deployment's canary adds to
// each of its requests: the pinned-name check, the draw and the
// deployment's name for the answer's header.
func BenchmarkCanaryHealthyPath(b *testing.B) {
	a := New(Options{Resolver: revisionResolver{"chat": "sha256:old", "chat@canary": "sha256:new", "odd@name": "sha256:odd"}})
	a.SetCanary("chat", "chat@canary", 10)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, pinned := a.pinned("chat"); pinned {
			b.Fatal("chat pins nothing")
		}
		t := a.canaries.Load()
		if t.deployment(t.split("chat", randIntN)) != "chat" {
			b.Fatal("the canary's deployment is chat")
		}
	}
}
