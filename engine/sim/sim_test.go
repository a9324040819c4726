package sim

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	profile8B  = "llama-3.1-8b-fp8-h100"
	profile70B = "llama-3.1-70b-fp8-2xh100"
)

func mustLoad(t testing.TB, name string) Profile {
	t.Helper()
	p, err := LoadProfile(name)
	if err != nil {
		t.Fatalf("LoadProfile(%q): %v", name, err)
	}
	return p
}

func TestEmbeddedProfilesLoadAndValidate(t *testing.T) {
	names := Profiles()
	for _, want := range []string{profile8B, profile70B} {
		if !slices.Contains(names, want) {
			t.Errorf("Profiles() = %v, want it to contain %q", names, want)
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("Profiles() = %v, want sorted", names)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			p := mustLoad(t, name)
			if p.Name != name {
				t.Errorf("Name = %q, want the file's name %q", p.Name, name)
			}
			if err := p.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if len(p.Sources) < 3 {
				t.Errorf("Sources has %d entries, want the published figures and derivations listed", len(p.Sources))
			}
			if p.VocabSize != 128256 || p.MaxModelLen != 131072 {
				t.Errorf("VocabSize, MaxModelLen = %d, %d, want Llama-3.1's 128256, 131072", p.VocabSize, p.MaxModelLen)
			}
		})
	}
}

func TestStepTimeGrowsWithEachArgument(t *testing.T) {
	bases := []struct{ prefill, decode, context int }{
		{0, 1, 0},
		{0, 1, 1024},
		{512, 8, 8 * 2048},
		{8192, 256, 200000},
	}
	for _, name := range Profiles() {
		p := mustLoad(t, name)
		for _, b := range bases {
			base := p.StepTime(b.prefill, b.decode, b.context)
			for _, step := range []int{1, 16, 1000} {
				cases := []struct {
					arg string
					got time.Duration
				}{
					{"prefillTokens", p.StepTime(b.prefill+step, b.decode, b.context)},
					{"decodeSeqs", p.StepTime(b.prefill, b.decode+step, b.context)},
					{"contextTokens", p.StepTime(b.prefill, b.decode, b.context+step)},
				}
				for _, c := range cases {
					if c.got <= base {
						t.Errorf("%s: StepTime%v = %v; adding %d to %s gave %v, want more",
							name, b, base, step, c.arg, c.got)
					}
				}
			}
		}
	}
}

func TestStepTimeEdgeCases(t *testing.T) {
	p := mustLoad(t, profile8B)
	tests := []struct {
		name                     string
		prefill, decode, context int
		want                     time.Duration
	}{
		{"no work", 0, 0, 0, 0},
		{"negatives count as zero", -5, -1, -100, 0},
		{"negative prefill ignored", -5, 1, 0, p.StepOverhead + p.DecodePerSeq},
		{"saturates instead of overflowing", math.MaxInt, math.MaxInt, math.MaxInt, math.MaxInt64},
		{"one prompt token", 1, 0, 0, p.StepOverhead + p.PrefillPerToken},
		{"exact sum", 10, 2, 300, p.StepOverhead + 10*p.PrefillPerToken + 2*p.DecodePerSeq + 300*p.DecodePerContextToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.StepTime(tt.prefill, tt.decode, tt.context); got != tt.want {
				t.Errorf("StepTime(%d, %d, %d) = %v, want %v", tt.prefill, tt.decode, tt.context, got, tt.want)
			}
		})
	}
}

// TestPublishedRanges checks that the profiles reproduce the published (or,
// where marked, derived) figures their Sources cite. These are model
// outputs, not wall-clock measurements.
func TestPublishedRanges(t *testing.T) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	tests := []struct {
		profile, quantity string
		value             func(p Profile) float64
		lo, hi            float64
		source            string
	}{
		{
			profile8B, "single-stream TPOT at 1,024 tokens of context (ms)",
			func(p Profile) float64 { return ms(p.StepTime(0, 1, 1024)) },
			4.37, 10,
			"NIM Llama-3.1-8b-instruct ITL at concurrency 1 is 4.37-4.63 ms (TensorRT-LLM, the fastest published); 10 ms is the slow end quoted for vLLM-class engines",
		},
		{
			profile8B, "TTFT of a 1,024-token prompt (ms)",
			func(p Profile) float64 { return ms(p.StepTime(1024, 0, 0)) },
			10.5, 100,
			"derived: 10.5 ms is the H100 floor (2.4 ms weight read + 8.1 ms of FP8 compute at 100% of 1979 TFLOPS); 100 ms is 1k tokens at 10k tokens/s, the low end of reported 8B prefill rates",
		},
		{
			profile8B, "decode throughput at batch 64, 1,024 tokens of context each (tokens/s)",
			func(p Profile) float64 { return 64 / p.StepTime(0, 64, 64*1024).Seconds() },
			5103, 12215,
			"MLPerf Inference v5.1 vLLM FP8 8B on one H100: 5,103 (Server) / 5,777 (Offline) tokens/s; NIM: 8,018 tokens/s at concurrency 50 and 12,215 at 100",
		},
		{
			profile70B, "single-stream TPOT with a 5,000-token prompt (ms)",
			func(p Profile) float64 { return ms(p.StepTime(0, 1, 5250)) },
			18.58 * 0.9, 18.58 * 1.1,
			"NIM Llama-3.3-70b-instruct 2 x H100 fp8 TP2, 5000 in / 500 out: ITL 18.58 ms at concurrency 1 (within 10%)",
		},
		{
			profile70B, "single-stream TPOT with a 500-token prompt (ms)",
			func(p Profile) float64 { return ms(p.StepTime(0, 1, 1500)) },
			18.91 * 0.9, 18.91 * 1.1,
			"NIM Llama-3.3-70b-instruct 2 x H100 fp8 TP2, 500 in / 2000 out: ITL 18.91 ms at concurrency 1 (within 10%)",
		},
		{
			profile70B, "TTFT of a 5,000-token prompt (ms)",
			func(p Profile) float64 { return ms(p.StepTime(5000, 0, 0)) },
			406.77 * 0.9, 406.77 * 1.1,
			"NIM Llama-3.3-70b-instruct 2 x H100 fp8 TP2: TTFT 406.77 ms at concurrency 1 (within 10%)",
		},
		{
			profile70B, "TTFT of a 500-token prompt (ms)",
			func(p Profile) float64 { return ms(p.StepTime(500, 0, 0)) },
			47.77 * 0.8, 47.77 * 1.25,
			"NIM Llama-3.3-70b-instruct 2 x H100 fp8 TP2: TTFT 47.77 ms (within 25%: the linear model overstates short prompts)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.profile+"/"+tt.quantity, func(t *testing.T) {
			got := tt.value(mustLoad(t, tt.profile))
			if got < tt.lo || got > tt.hi {
				t.Errorf("%s = %.2f, want within [%.2f, %.2f] (%s)", tt.quantity, got, tt.lo, tt.hi, tt.source)
			}
		})
	}
}

const validYAML = `name: test-profile
model: test/model
hardware: 1x imaginary GPU
sources:
  - "made up for a test"
step_overhead: 5ms
prefill_per_token: 20us
decode_per_seq: 10us
decode_per_context_token: 50ns
kv_capacity_tokens: 4096
max_num_seqs: 16
max_model_len: 2048
vocab_size: 32000
`

const validJSON = `{
	"name": "test-profile",
	"model": "test/model",
	"hardware": "1x imaginary GPU",
	"sources": ["made up for a test"],
	"step_overhead": "5ms",
	"prefill_per_token": "20us",
	"decode_per_seq": "10us",
	"decode_per_context_token": "50ns",
	"kv_capacity_tokens": 4096,
	"max_num_seqs": 16,
	"max_model_len": 2048,
	"vocab_size": 32000
}`

var wantTestProfile = Profile{
	Name:                  "test-profile",
	Model:                 "test/model",
	Hardware:              "1x imaginary GPU",
	Accelerators:          1,
	Sources:               []string{"made up for a test"},
	StepOverhead:          5 * time.Millisecond,
	PrefillPerToken:       20 * time.Microsecond,
	DecodePerSeq:          10 * time.Microsecond,
	DecodePerContextToken: 50 * time.Nanosecond,
	KVCapacityTokens:      4096,
	MaxNumSeqs:            16,
	MaxModelLen:           2048,
	VocabSize:             32000,
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadProfileFromFile(t *testing.T) {
	tests := []struct{ file, content string }{
		{"p.yaml", validYAML},
		{"p.yml", validYAML},
		{"p.json", validJSON},
		{"p", validYAML}, // no extension: YAML
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := LoadProfile(writeFile(t, tt.file, tt.content))
			if err != nil {
				t.Fatalf("LoadProfile: %v", err)
			}
			if !profilesEqual(got, wantTestProfile) {
				t.Errorf("got %+v, want %+v", got, wantTestProfile)
			}
		})
	}
}

func profilesEqual(a, b Profile) bool { return reflect.DeepEqual(a, b) }

func TestLoadProfileErrors(t *testing.T) {
	replace := func(s, old, new string) string {
		if !strings.Contains(s, old) {
			panic("test setup: " + old + " not in profile")
		}
		return strings.Replace(s, old, new, 1)
	}
	tests := []struct {
		name, file, content string
		want                []string // substrings of the error
	}{
		{"missing field", "p.yaml", replace(validYAML, "vocab_size: 32000\n", ""),
			[]string{"field vocab_size: missing"}},
		{"two missing fields", "p.yaml", replace(replace(validYAML, "model: test/model\n", ""), "decode_per_seq: 10us\n", ""),
			[]string{"field model: missing", "field decode_per_seq: missing"}},
		{"negative time", "p.yaml", replace(validYAML, "step_overhead: 5ms", "step_overhead: -5ms"),
			[]string{"field step_overhead: must be a positive duration, got -5ms"}},
		{"zero time", "p.yaml", replace(validYAML, "decode_per_context_token: 50ns", "decode_per_context_token: 0s"),
			[]string{"field decode_per_context_token: must be a positive duration"}},
		{"time without unit", "p.yaml", replace(validYAML, "prefill_per_token: 20us", "prefill_per_token: 0.00002"),
			[]string{"field prefill_per_token: want a duration with a unit", `"0.00002"`}},
		{"time not a duration", "p.yaml", replace(validYAML, "decode_per_seq: 10us", "decode_per_seq: fast"),
			[]string{"field decode_per_seq: want a duration"}},
		{"zero max_num_seqs", "p.yaml", replace(validYAML, "max_num_seqs: 16", "max_num_seqs: 0"),
			[]string{"field max_num_seqs: must be positive, got 0"}},
		{"negative kv capacity", "p.yaml", replace(validYAML, "kv_capacity_tokens: 4096", "kv_capacity_tokens: -1"),
			[]string{"field kv_capacity_tokens: must be positive, got -1"}},
		{"kv smaller than max_model_len", "p.yaml", replace(validYAML, "kv_capacity_tokens: 4096", "kv_capacity_tokens: 1024"),
			[]string{"field kv_capacity_tokens: 1024 is less than max_model_len 2048"}},
		{"empty name", "p.yaml", replace(validYAML, "name: test-profile", `name: ""`),
			[]string{"field name: must not be empty"}},
		{"no sources", "p.yaml", replace(validYAML, "sources:\n  - \"made up for a test\"\n", "sources: []\n"),
			[]string{"field sources: must list at least one source"}},
		{"missing and invalid together", "p.yaml", replace(replace(validYAML, "vocab_size: 32000\n", ""), "max_num_seqs: 16", "max_num_seqs: -3"),
			[]string{"field vocab_size: missing", "field max_num_seqs: must be positive, got -3"}},
		{"unknown key", "p.yaml", validYAML + "step_overhed: 5ms\n",
			[]string{"parse sim profile", "step_overhed"}},
		{"bad YAML", "p.yaml", "name: [unclosed\n",
			[]string{"parse sim profile"}},
		{"wrong type", "p.yaml", replace(validYAML, "max_model_len: 2048", "max_model_len: long"),
			[]string{"parse sim profile", "long"}},
		{"empty file", "p.yaml", "",
			[]string{"field name: missing", "field vocab_size: missing"}},
		{"JSON missing field", "p.json", replace(validJSON, `"max_model_len": 2048,`, ""),
			[]string{"field max_model_len: missing"}},
		{"JSON negative time", "p.json", replace(validJSON, `"decode_per_seq": "10us"`, `"decode_per_seq": "-1us"`),
			[]string{"field decode_per_seq: must be a positive duration"}},
		{"JSON unknown key", "p.json", replace(validJSON, `"vocab_size": 32000`, `"vocab_size": 32000, "vocab": 1`),
			[]string{"parse sim profile", `unknown field "vocab"`}},
		{"JSON number for a duration", "p.json", replace(validJSON, `"step_overhead": "5ms"`, `"step_overhead": 5`),
			[]string{"parse sim profile", "step_overhead"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.file, tt.content)
			_, err := LoadProfile(path)
			if err == nil {
				t.Fatalf("LoadProfile succeeded, want an error containing %q", tt.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, path) {
				t.Errorf("error %q does not name the file %s", msg, path)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestLoadProfileUnknownNameOrPath(t *testing.T) {
	tests := []struct {
		name, arg string
		want      []string
	}{
		{"unknown name", "llama-9b-on-a-toaster", []string{`"llama-9b-on-a-toaster"`, "no embedded profile", profile8B, profile70B}},
		{"empty", "", []string{"no name or path", profile8B}},
		{"missing file", filepath.Join(t.TempDir(), "nope.yaml"), []string{"nope.yaml", "no such file"}},
		{"directory", t.TempDir(), []string{"load sim profile"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadProfile(tt.arg)
			if err == nil {
				t.Fatalf("LoadProfile(%q) succeeded, want an error", tt.arg)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidateReportsEveryField(t *testing.T) {
	err := Profile{}.Validate()
	if err == nil {
		t.Fatal("Validate of an empty profile succeeded")
	}
	for _, field := range []string{"name", "model", "hardware", "sources", "step_overhead", "prefill_per_token",
		"decode_per_seq", "decode_per_context_token", "kv_capacity_tokens", "max_num_seqs", "max_model_len", "vocab_size"} {
		if !strings.Contains(err.Error(), "field "+field+":") {
			t.Errorf("error %q does not name field %s", err, field)
		}
	}
	if err := wantTestProfile.Validate(); err != nil {
		t.Errorf("Validate of a good profile: %v", err)
	}
}

func BenchmarkStepTime(b *testing.B) {
	p := mustLoad(b, profile8B)
	var sink time.Duration
	for i := 0; b.Loop(); i++ {
		sink += p.StepTime(i&511, 64, 64*1024+i)
	}
	_ = sink
}
