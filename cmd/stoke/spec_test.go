package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEngineSpeculativeConfigErrors checks that a --speculative-config
// that does not parse or holds values out of range stops `stoke engine`
// at startup with exit status 1 and one line naming the problem.
func TestEngineSpeculativeConfigErrors(t *testing.T) {
	sock := "unix://" + filepath.Join(t.TempDir(), "e.sock")
	for _, tc := range []struct{ config, want string }{
		{`{"method":"ngram"`, "--speculative-config: speculative config: "},
		{`{"method":"ngram","num_speculative_tokens":0}`, "num_speculative_tokens must be in [1, 64], got 0"},
		{`{"method":"eagle","model":"m","num_speculative_tokens":2}`, `method "eagle" is not supported here`},
		{`{"method":"ngram","num_speculative_tokens":2,"lookahead":1}`, `unknown field "lookahead"`},
	} {
		t.Run(tc.config, func(t *testing.T) {
			code, stderr := stokeProcess(t, nil, time.Minute, "engine", "--blank", "--listen", sock, "--speculative-config", tc.config)
			line := strings.TrimSuffix(stderr, "\n")
			if code != 1 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "stoke: ") || !strings.Contains(line, tc.want) {
				t.Fatalf("exit %d, stderr %q: want exit 1 and one line \"stoke: …%s…\"", code, stderr, tc.want)
			}
		})
	}
}
