package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
)

// TestRolloutLifecycle: one canary per deployment; promotion moves the
// deployment to the candidate with its spec, unpinned; rejection marks the
// candidate revision rejected; an ended rollout never moves again.
func TestRolloutLifecycle(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		for _, digest := range []string{"sha256:old", "sha256:bad", "sha256:good"} {
			if _, err := s.PutRevision(ctx, Revision{Model: "chat", Digest: digest}); err != nil {
				t.Fatal(err)
			}
			if err := s.SetRevisionState(ctx, "chat", digest, RevisionReady, ""); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.PutDeployment(ctx, Deployment{Name: "chat", Revision: "sha256:old", Spec: json.RawMessage(`{"replicas":{"max":2}}`)}); err != nil {
			t.Fatal(err)
		}

		bad, err := s.StartRollout(ctx, Rollout{Deployment: "chat", Stable: "sha256:old", Candidate: "sha256:bad", CanaryPercent: 10})
		if err != nil {
			t.Fatal(err)
		}
		if bad.ID == 0 || bad.State != RolloutCanary || string(bad.Spec) != "{}" {
			t.Fatalf("started %+v, want an id, canary, spec {}", bad)
		}
		if _, err := s.StartRollout(ctx, Rollout{Deployment: "chat", Stable: "sha256:old", Candidate: "sha256:good"}); !errors.Is(err, ErrIllegalTransition) {
			t.Fatalf("a second canary on chat: %v, want ErrIllegalTransition", err)
		}
		if act, err := s.ActiveRollouts(ctx); err != nil || len(act) != 1 || act[0].ID != bad.ID {
			t.Fatalf("active rollouts %+v, %v; want the bad one", act, err)
		}
		figures := json.RawMessage(`{"promote":false}`)
		if _, err := s.FinishRollout(ctx, bad.ID, RolloutRejected, "worse", figures); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Revision(ctx, "chat", "sha256:bad"); err != nil || r.State != RevisionRejected || r.Reason != "worse" {
			t.Fatalf("bad revision %+v, %v; want rejected with the reason", r, err)
		}
		if d, _ := s.Deployment(ctx, "chat"); d.Revision != "sha256:old" {
			t.Fatalf("a rejection moved the deployment to %s", d.Revision)
		}
		if _, err := s.FinishRollout(ctx, bad.ID, RolloutPromoted, "", nil); !errors.Is(err, ErrIllegalTransition) {
			t.Fatalf("promoting a rejected rollout: %v, want ErrIllegalTransition", err)
		}
		if _, err := s.FinishRollout(ctx, 999, RolloutPromoted, "", nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an unknown rollout: %v, want ErrNotFound", err)
		}

		d, _ := s.Deployment(ctx, "chat")
		d.Pinned = true
		if err := s.PutDeployment(ctx, d); err != nil {
			t.Fatal(err)
		}
		good, err := s.StartRollout(ctx, Rollout{Deployment: "chat", Stable: "sha256:old", Candidate: "sha256:good", CanaryPercent: 50,
			Spec: json.RawMessage(`{"replicas":{"max":3}}`)})
		if err != nil {
			t.Fatal(err)
		}
		ended, err := s.FinishRollout(ctx, good.ID, RolloutPromoted, "better", nil)
		if err != nil || ended.State != RolloutPromoted || ended.Reason != "better" {
			t.Fatalf("promoted %+v, %v", ended, err)
		}
		d, _ = s.Deployment(ctx, "chat")
		if d.Revision != "sha256:good" || string(d.Spec) != `{"replicas":{"max":3}}` || d.Pinned {
			t.Fatalf("after promotion the deployment is %+v; want the candidate, its spec, unpinned", d)
		}
		if r, _ := s.Revision(ctx, "chat", "sha256:good"); r.State != RevisionReady {
			t.Fatalf("a promoted revision is %s, want ready", r.State)
		}
		all, err := s.Rollouts(ctx, "chat")
		if err != nil || len(all) != 2 || all[0].ID != good.ID || string(all[1].Eval) != string(figures) {
			t.Fatalf("rollouts %+v, %v; want the good then the bad one with its figures", all, err)
		}
		if other, _ := s.Rollouts(ctx, "other"); len(other) != 0 {
			t.Fatalf("another deployment's rollouts: %+v", other)
		}
	})
}

// TestRolloutInvalid: a rollout names its deployment and both revisions,
// with a share in [0, 100].
func TestRolloutInvalid(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := bk.open(t)
		for _, r := range []Rollout{
			{Stable: "a", Candidate: "b"},
			{Deployment: "d", Candidate: "b"},
			{Deployment: "d", Stable: "a"},
			{Deployment: "d", Stable: "a", Candidate: "b", CanaryPercent: 101},
			{Deployment: "d", Stable: "a", Candidate: "b", Spec: json.RawMessage("{")},
		} {
			if _, err := s.StartRollout(context.Background(), r); !errors.Is(err, ErrInvalid) {
				t.Errorf("StartRollout(%+v) = %v, want ErrInvalid", r, err)
			}
		}
	})
}
