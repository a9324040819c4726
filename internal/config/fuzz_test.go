package config

import (
	"encoding/json"
	"testing"
)

// FuzzParse parses arbitrary bytes as a spec (JSON, and YAML through
// ParseYAML): it must not panic, every spec it accepts must be within the
// bounds, and its effective form (the JSON the admin API shows) must parse
// to the same spec.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		``, `null`, `{}`, `[]`, `5`, `"x"`,
		`{"replicas":{"min":1,"max":3}}`,
		`{"replicas":{"max":6,"sleeping":1},"target_concurrency":2.5}`,
		`{"window":"2m","buffer":{"timeout":5},"ttft_slo":"250ms"}`,
		`{"idle_delay":0.5,"buffer":{"capacity":0,"timeout":"10ms"}}`,
		`{"replicaz":{"max":2}}`,
		`{"buffer":{"timeout":1e300}}`,
		"replicas:\n  min: 1\n  max: 2\nwindow: 30s\n",
		"ttft_slo: 1ns\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, parse := range []func([]byte) (Spec, error){
			func(b []byte) (Spec, error) { return Parse(b) },
			ParseYAML,
		} {
			s, err := parse(raw)
			if err != nil {
				continue
			}
			if err := s.Validate(); err != nil {
				t.Fatalf("accepted %q as %+v, which does not validate: %v", raw, s, err)
			}
			eff, err := json.Marshal(s)
			if err != nil {
				t.Fatalf("marshal %+v: %v", s, err)
			}
			again, err := Parse(eff)
			if err != nil || again != s {
				t.Fatalf("%q: effective spec %s parses to %+v (%v), want %+v", raw, eff, again, err, s)
			}
		}
	})
}
