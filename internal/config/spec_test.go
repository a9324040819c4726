package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, raw, wantErr string
		check              func(Spec) bool
	}{
		{name: "empty is the default", raw: "", check: func(s Spec) bool { return s == Default() }},
		{name: "null is the default", raw: "null", check: func(s Spec) bool { return s == Default() }},
		{name: "overrides", raw: `{"replicas":{"min":1,"max":3},"idle_delay":"5s","buffer":{"timeout":2}}`, check: func(s Spec) bool {
			return s.Replicas == Replicas{1, 3, 3} && time.Duration(s.IdleDelay) == 5*time.Second && time.Duration(s.Buffer.Timeout) == 2*time.Second &&
				s.TargetConcurrency == 8 && s.Buffer.Capacity == 1000
		}},
		{name: "sleeping set", raw: `{"replicas":{"max":6,"sleeping":1}}`, check: func(s Spec) bool { return s.Replicas == Replicas{0, 6, 1} }},
		{name: "sleeping none", raw: `{"replicas":{"sleeping":0}}`, check: func(s Spec) bool { return s.Replicas == Replicas{0, 4, 0} }},
		{name: "negative sleeping", raw: `{"replicas":{"sleeping":-2}}`, wantErr: "replicas.sleeping"},
		{name: "max below min", raw: `{"replicas":{"min":3,"max":2}}`, wantErr: "replicas.max"},
		{name: "bad duration", raw: `{"idle_delay":"soon"}`, wantErr: "soon"},
		{name: "zero target", raw: `{"target_concurrency":0}`, wantErr: "target_concurrency"},
		{name: "not JSON", raw: `{`, wantErr: "deployment spec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse([]byte(tc.raw))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(s) {
				t.Fatalf("Parse(%s) = %+v, %v", tc.raw, s, err)
			}
		})
	}
}

// TestEffectiveSpecRoundTrip checks that the effective spec the admin API
// shows (a parsed spec written back as JSON) names every field and parses
// to the same spec, so an operator can PUT back what they read.
func TestEffectiveSpecRoundTrip(t *testing.T) {
	for _, raw := range []string{``, `{}`, `{"replicas":{"min":1,"max":3}}`, `{"window":"2m","buffer":{"timeout":5},"ttft_slo":"250ms"}`} {
		s, err := Parse([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, field := range []string{`"min"`, `"max"`, `"sleeping"`, `"target_concurrency"`, `"ttft_slo"`, `"window"`, `"idle_delay"`, `"capacity"`, `"timeout"`} {
			if !strings.Contains(string(b), field) {
				t.Errorf("%q: effective spec %s lacks %s", raw, b, field)
			}
		}
		again, err := Parse(b)
		if err != nil || again != s {
			t.Errorf("%q: effective spec %s parses to %+v (%v), want %+v", raw, b, again, err, s)
		}
	}
}
