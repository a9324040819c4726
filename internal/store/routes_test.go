package store

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"
)

func TestRoutesPutListReplaceDelete(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		clock := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
		s.now = func() time.Time { return clock }

		if rs, err := s.Routes(ctx); err != nil || len(rs) != 0 {
			t.Fatalf("Routes on a fresh store = %v, %v; want none", rs, err)
		}
		for _, name := range []string{"zeta", "org/chat", "alpha"} {
			spec := json.RawMessage(`{"name":"` + name + `","split":[{"to":"d","weight":1}]}`)
			got, err := s.PutRoute(ctx, name, spec)
			if err != nil {
				t.Fatalf("PutRoute(%s): %v", name, err)
			}
			if got.Name != name || string(got.Spec) != string(spec) || !got.UpdatedAt.Equal(clock) {
				t.Errorf("PutRoute(%s) = %+v, want the name, spec and %v", name, got, clock)
			}
		}
		rs, err := s.Routes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range rs {
			names = append(names, r.Name)
		}
		if want := []string{"alpha", "org/chat", "zeta"}; !slices.Equal(names, want) {
			t.Errorf("Routes names = %v, want %v (by name)", names, want)
		}
		if !rs[0].UpdatedAt.Equal(clock) || rs[0].UpdatedAt.Location() != time.UTC {
			t.Errorf("UpdatedAt = %v, want %v in UTC", rs[0].UpdatedAt, clock)
		}

		// Putting a name again replaces its spec and time.
		later := clock.Add(time.Hour)
		s.now = func() time.Time { return later }
		newSpec := json.RawMessage(`{"name":"org/chat","split":[{"to":"e","weight":3}]}`)
		if _, err := s.PutRoute(ctx, "org/chat", newSpec); err != nil {
			t.Fatal(err)
		}
		rs, err = s.Routes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 3 || rs[1].Name != "org/chat" || string(rs[1].Spec) != string(newSpec) || !rs[1].UpdatedAt.Equal(later) {
			t.Errorf("after replace Routes = %+v; want org/chat with the new spec at %v", rs, later)
		}

		if err := s.DeleteRoute(ctx, "org/chat"); err != nil {
			t.Fatalf("DeleteRoute: %v", err)
		}
		if err := s.DeleteRoute(ctx, "org/chat"); !errors.Is(err, ErrNotFound) {
			t.Errorf("DeleteRoute twice = %v, want ErrNotFound", err)
		}
		rs, err = s.Routes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 2 || rs[0].Name != "alpha" || rs[1].Name != "zeta" {
			t.Errorf("after delete Routes = %+v, want alpha and zeta", rs)
		}
	})
}

func TestPutRouteRefusesInvalid(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		cases := []struct {
			name string
			spec string
		}{
			{"", `{"name":""}`},
			{"r", ``},
			{"r", `not json`},
			{"r", `[1,2]`},
			{"r", `null`},
			{"r", `"a string"`},
		}
		for _, c := range cases {
			if _, err := s.PutRoute(ctx, c.name, json.RawMessage(c.spec)); !errors.Is(err, ErrInvalid) {
				t.Errorf("PutRoute(%q, %q) = %v, want ErrInvalid", c.name, c.spec, err)
			}
		}
		if rs, err := s.Routes(ctx); err != nil || len(rs) != 0 {
			t.Errorf("Routes after refused puts = %v, %v; want none", rs, err)
		}
	})
}

func TestDeleteRouteUnknown(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		if err := bk.open(t).DeleteRoute(context.Background(), "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("DeleteRoute(nope) = %v, want ErrNotFound", err)
		}
	})
}

func TestRoutesSurviveReopen(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		s, err := OpenState(ctx, tg.state, tg.dir)
		if err != nil {
			t.Fatal(err)
		}
		spec := json.RawMessage(`{"name":"r","split":[{"to":"d","weight":1}]}`)
		if _, err := s.PutRoute(ctx, "r", spec); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openAt(t, tg)
		rs, err := s.Routes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 1 || rs[0].Name != "r" || string(rs[0].Spec) != string(spec) {
			t.Errorf("Routes after reopen = %+v, want r with its spec", rs)
		}
	})
}
