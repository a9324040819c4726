package config

import (
	"strings"
	"testing"
)

// TestBounds is issue 13's finding 4: every field's bounds, and unknown
// fields, refused with an error naming the field.
func TestBounds(t *testing.T) {
	for _, tc := range []struct{ raw, field string }{
		{`{"replicas":{"min":1000000,"max":1000000}}`, "replicas.max: 1000000 exceeds"},
		{`{"replicas":{"max":1025}}`, "replicas.max: 1025 exceeds"},
		{`{"replicas":{"max":0}}`, "replicas.max: 0"},
		{`{"replicas":{"min":-1}}`, "replicas.min: -1"},
		{`{"replicas":{"min":5,"max":4}}`, "replicas.max: 4 must be at least replicas.min 5"},
		{`{"replicas":{"max":4,"sleeping":5}}`, "replicas.sleeping: 5 exceeds replicas.max 4"},
		{`{"replicas":{"sleeping":-1}}`, "replicas.sleeping: -1"},
		{`{"price":{"input_per_1m":-1}}`, "price.input_per_1m: -1 is outside"},
		{`{"price":{"output_per_1m":20000}}`, "price.output_per_1m: 20000 is outside"},
		{`{"cost":{"replica_hourly_usd":-0.5}}`, "cost.replica_hourly_usd: -0.5 is outside"},
		{`{"cost":{"replica_hourly_usd":5000}}`, "cost.replica_hourly_usd: 5000 is outside"},
		{`{"target_concurrency":1e-300}`, "target_concurrency: 1e-300"},
		{`{"target_concurrency":1e308}`, "target_concurrency: 1e+308"},
		{`{"target_concurrency":0.009}`, "target_concurrency"},
		{`{"target_concurrency":100001}`, "target_concurrency"},
		{`{"target_concurrency":-1}`, "target_concurrency"},
		{`{"ttft_slo":"1ns"}`, "ttft_slo: 1ns"},
		{`{"ttft_slo":"2h"}`, "ttft_slo: 2h0m0s"},
		{`{"ttft_slo":0}`, "ttft_slo"},
		{`{"window":"999ms"}`, "window: 999ms"},
		{`{"window":"61m"}`, "window: 1h1m0s"},
		{`{"idle_delay":"-1s"}`, "idle_delay: -1s"},
		{`{"idle_delay":"25h"}`, "idle_delay: 25h0m0s"},
		{`{"buffer":{"capacity":9223372036854775807}}`, "buffer.capacity: 9223372036854775807 exceeds"},
		{`{"buffer":{"capacity":1000001}}`, "buffer.capacity: 1000001 exceeds"},
		{`{"buffer":{"capacity":-1}}`, "buffer.capacity: -1"},
		{`{"buffer":{"timeout":"87600h"}}`, "buffer.timeout: 87600h0m0s"},
		{`{"buffer":{"timeout":"1ms"}}`, "buffer.timeout: 1ms"},
		{`{"buffer":{"timeout":0}}`, "buffer.timeout: 0s"},
		{`{"buffer":{"timeout":1e300}}`, "out of range"},
		{`{"replicaz":{"max":2}}`, "replicaz: unknown field"},
		{`{"replicas":{"mn":1}}`, "replicas.mn: unknown field"},
		{`{"buffer":{"capacity":1,"timeoutt":"1s"}}`, "buffer.timeoutt: unknown field"},
		{`{"Replicas":{"max":2}}`, "Replicas: unknown field"},
		{`{"forecast":{"period":"5s"}}`, "forecast.period: 5s"},
		{`{"forecast":{"period":"200h"}}`, "forecast.period: 200h0m0s"},
		{`{"forecast":{"period":"60s","bucket":"500ms"}}`, "forecast.bucket: 500ms"},
		{`{"forecast":{"period":"60s","bucket":"2m"}}`, "forecast.bucket: 2m0s"},
		{`{"forecast":{"period":"60s","bucket":"7s"}}`, "forecast.period: 1m0s is not a whole number of buckets"},
		{`{"rollout":{"canary_percent":101}}`, "rollout.canary_percent: 101"},
		{`{"rollout":{"canary_percent":-1}}`, "rollout.canary_percent: -1"},
		{`{"rollout":{"eval":{"file":"../eval.jsonl"}}}`, "rollout.eval.file"},
		{`{"rollout":{"eval":{"file":"evals/a.jsonl"}}}`, "rollout.eval.file"},
		{`{"rollout":{"eval":{"file":"e.jsonl","metric":"bleu"}}}`, "rollout.eval.metric"},
		{`{"rollout":{"eval":{"file":"e.jsonl","max_regression":1.5}}}`, "rollout.eval.max_regression: 1.5"},
		{`{"rollout":{"eval":{"file":"e.jsonl","metric":"log_likelihood","max_regression":101}}}`, "rollout.eval.max_regression: 101"},
		{`{"rollout":{"eval":{"max_tokens":0}}}`, "rollout.eval.max_tokens: 0"},
		{`{"rollout":{"eval":{"timeout":"100ms"}}}`, "rollout.eval.timeout: 100ms"},
		{`{"rollout":{"eval":{"fle":"e.jsonl"}}}`, "rollout.eval.fle: unknown field"},
	} {
		_, err := Parse([]byte(tc.raw))
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Parse(%s) = %v, want an error with %q", tc.raw, err, tc.field)
		}
	}
	// The bounds themselves are accepted.
	for _, raw := range []string{
		`{"replicas":{"min":1024,"max":1024,"sleeping":1024},"target_concurrency":100000,"ttft_slo":"1h","window":"1h","idle_delay":"24h","buffer":{"capacity":1000000,"timeout":"1h"}}`,
		`{"replicas":{"min":0,"max":1,"sleeping":0},"target_concurrency":0.01,"ttft_slo":"10ms","window":"1s","idle_delay":0,"buffer":{"capacity":0,"timeout":"10ms"}}`,
		`{"forecast":{"predictive":false,"period":"10s","bucket":"1s"}}`,
		`{"forecast":{"period":"168h","bucket":"1s"}}`,
		`{"rollout":{"canary_percent":100,"eval":{"file":"eval.jsonl","metric":"log_likelihood","max_regression":100,"max_tokens":4096,"timeout":"24h"}}}`,
		`{"rollout":{"canary_percent":0,"eval":{"file":"eval.jsonl","metric":"exact_match","max_regression":1,"max_tokens":1,"timeout":"1s"}}}`,
	} {
		if _, err := Parse([]byte(raw)); err != nil {
			t.Errorf("Parse(%s): %v", raw, err)
		}
	}
}

func TestParseYAML(t *testing.T) {
	for _, tc := range []struct{ raw, wantErr string }{
		{"replicaz:\n  max: 2\n", "replicaz: unknown field"},
		{"replicas:\n  max: 2\n  mni: 1\n", "replicas.mni: unknown field"},
		{"replicas:\n  min: 1000000\n  max: 1000000\n", "replicas.max: 1000000 exceeds"},
		{"buffer:\n  timeout: 87600h\n", "buffer.timeout"},
		{"ttft_slo: 1ns\n", "ttft_slo: 1ns"},
		{"- a\n", "want a mapping"},
		{"replicas: [\n", "deployment spec"},
	} {
		_, err := ParseYAML([]byte(tc.raw))
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ParseYAML(%q) = %v, want an error with %q", tc.raw, err, tc.wantErr)
		}
	}
	s, err := ParseYAML([]byte("replicas:\n  min: 1\n  max: 3\nwindow: 2m\nbuffer:\n  timeout: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Replicas = Replicas{1, 3, 3}
	want.Window = Duration(120e9)
	want.Buffer.Timeout = Duration(5e9)
	if s != want {
		t.Errorf("ParseYAML = %+v, want %+v", s, want)
	}
	if s, err := ParseYAML(nil); err != nil || s != Default() {
		t.Errorf("ParseYAML(empty) = %+v, %v", s, err)
	}
}

func TestCheckNode(t *testing.T) {
	s := Default() // max 4
	for _, tc := range []struct {
		slots   int
		spec    Replicas
		wantErr string
	}{
		{8, Replicas{0, 4, 4}, ""},
		{4, Replicas{0, 4, 4}, ""},
		{0, Replicas{0, 1024, 0}, ""}, // slots unknown
		{2, Replicas{0, 4, 4}, ""},    // a maximum past the node is capped, not refused
		{2, Replicas{3, 4, 4}, "replicas.min: 3 exceeds the node's 2 slots"},
	} {
		s.Replicas = tc.spec
		err := s.CheckNode(tc.slots)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckNode(%d) of %+v = %v, want %q", tc.slots, tc.spec, err, tc.wantErr)
		}
	}
}
