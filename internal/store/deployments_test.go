package store

import (
	"context"
	"errors"
	"testing"
)

func TestDeployments(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		if _, err := s.Deployment(ctx, "m"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing deployment: %v", err)
		}
		for _, d := range []Deployment{
			{Name: "m", Revision: "sha256:a"},
			{Name: "m", Revision: "sha256:b", Spec: []byte(`{"replicas":{"max":2}}`)},
			{Name: "a", Revision: "sha256:c"},
		} {
			if err := s.PutDeployment(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		d, err := s.Deployment(ctx, "m")
		if err != nil || d.Revision != "sha256:b" || string(d.Spec) != `{"replicas":{"max":2}}` {
			t.Fatalf("deployment m: %+v %v", d, err)
		}
		all, err := s.Deployments(ctx)
		if err != nil || len(all) != 2 || all[0].Name != "a" || string(all[0].Spec) != "{}" {
			t.Fatalf("deployments: %+v %v", all, err)
		}
		for _, bad := range []Deployment{{Name: "x"}, {Revision: "r"}, {Name: "x", Revision: "r", Spec: []byte("{")}} {
			if err := s.PutDeployment(ctx, bad); !errors.Is(err, ErrInvalid) {
				t.Errorf("PutDeployment(%+v): %v, want ErrInvalid", bad, err)
			}
		}
	})
}
