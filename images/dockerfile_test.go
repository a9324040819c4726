package images

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// finalStage returns the instructions of a Dockerfile's last stage as
// (keyword, arguments) pairs, continuation lines joined.
func finalStage(t *testing.T, path string) [][2]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		stage [][2]string
		cur   strings.Builder
	)
	for _, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if rest, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(trimmed)
		kw, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		kw = strings.ToUpper(kw)
		if kw == "FROM" {
			stage = nil
		}
		stage = append(stage, [2]string{kw, strings.TrimSpace(args)})
	}
	return stage
}

// keyValues splits `k=v k2="v two"` into a map.
func keyValues(t *testing.T, s string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		k, rest, ok := strings.Cut(s, "=")
		if !ok {
			t.Fatalf("no = in %q", s)
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				t.Fatalf("unterminated quote in %q", rest)
			}
			v, s = rest[1:end+1], rest[end+2:]
		} else {
			v, s, _ = strings.Cut(rest, " ")
		}
		m[k] = v
	}
	return m
}

func TestDockerfilesMatchTheDaemonlessImages(t *testing.T) {
	files := map[string]string{StokeImage: "Dockerfile.stoke", EngineImage: "Dockerfile.engine"}
	for _, s := range imageSpecs {
		t.Run(files[s.name], func(t *testing.T) {
			want := imageConfig(s, DefaultTag, time.Unix(0, 0), "")
			stage := finalStage(t, files[s.name])
			if len(stage) == 0 || stage[0][0] != "FROM" || stage[0][1] != "scratch" {
				t.Fatalf("last stage starts with %v, want FROM scratch", stage[:min(1, len(stage))])
			}
			got := map[string]string{}
			var env, labels map[string]string
			for _, in := range stage {
				switch in[0] {
				case "ENV":
					env = keyValues(t, in[1])
				case "LABEL":
					labels = keyValues(t, in[1])
				default:
					got[in[0]] = in[1]
				}
			}
			for kw, wantArgs := range map[string][]string{"ENTRYPOINT": want.Entrypoint, "CMD": want.Cmd} {
				var args []string
				if err := json.Unmarshal([]byte(got[kw]), &args); err != nil {
					t.Errorf("%s %s is not a JSON array: %v", kw, got[kw], err)
				} else if !slices.Equal(args, wantArgs) {
					t.Errorf("%s %q, the daemonless image has %q", kw, args, wantArgs)
				}
			}
			for kw, wantArg := range map[string]string{"WORKDIR": want.WorkingDir, "USER": want.User, "STOPSIGNAL": want.StopSignal} {
				if got[kw] != wantArg {
					t.Errorf("%s %q, the daemonless image has %q", kw, got[kw], wantArg)
				}
			}
			var envList []string
			for k, v := range env {
				envList = append(envList, k+"="+v)
			}
			slices.Sort(envList)
			wantEnv := slices.Sorted(slices.Values(want.Env))
			if !slices.Equal(envList, wantEnv) {
				t.Errorf("ENV %q, the daemonless image has %q", envList, wantEnv)
			}
			for _, k := range []string{"title", "description", "source", "url"} {
				k = "org.opencontainers.image." + k
				if labels[k] != want.Labels[k] {
					t.Errorf("LABEL %s=%q, the daemonless image has %q", k, labels[k], want.Labels[k])
				}
			}
		})
	}
}
