package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/internal/testmodel"
)

// allKernelSets names every kernel set stoke has, runnable here or not.
var allKernelSets = []string{"avx512", "avx2", "generic"}

// supportedKernelSets names the kernel sets this CPU runs, fastest first.
func supportedKernelSets() []string {
	var names []string
	for _, s := range kernels.Supported() {
		names = append(names, s.Name())
	}
	return names
}

// stokeProcess runs the CLI as a process of its own, with env added to
// this one's, and returns its exit code and standard error. It fails t when
// the process runs past limit.
func stokeProcess(t *testing.T, env []string, limit time.Duration, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), runMainEnv+"=1"), env...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("stoke %s ran past %v: %s", strings.Join(args, " "), limit, stderr.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

// TestKernelsStartupErrors checks that a kernel set stoke cannot use, named
// by --kernels or by STOKE_KERNELS, stops `stoke engine` and `stoke
// generate` at startup with exit status 1 and one line of error.
func TestKernelsStartupErrors(t *testing.T) {
	dir := t.TempDir()
	// No command gets far enough to need a model: the kernel set is
	// checked first, and a blank engine or serve would otherwise start
	// listening.
	generate := []string{"generate", "--model", filepath.Join(dir, "no-model"), "--prompt-ids", "1"}
	engine := []string{"engine", "--blank", "--listen", "unix://" + filepath.Join(dir, "e.sock")}
	serve := []string{"serve", "--data", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0"}
	type tc struct {
		name string
		env  []string
		args []string
		want string
	}
	var cases []tc
	for _, cmd := range [][]string{generate, engine, serve} {
		cases = append(cases,
			tc{cmd[0] + "/flag unknown", nil, append(slices.Clone(cmd), "--kernels", "sse9"), `--kernels: unknown kernel set "sse9"`},
			tc{cmd[0] + "/env unknown", []string{kernels.EnvKernels + "=sse9"}, cmd, kernels.EnvKernels + `: unknown kernel set "sse9"`},
			tc{cmd[0] + "/env unknown under a good flag", []string{kernels.EnvKernels + "=sse9"}, append(slices.Clone(cmd), "--kernels", "generic"),
				kernels.EnvKernels + `: unknown kernel set "sse9"`},
		)
		for _, name := range allKernelSets {
			if slices.Contains(supportedKernelSets(), name) {
				continue
			}
			cases = append(cases,
				tc{cmd[0] + "/flag " + name + " unsupported", nil, append(slices.Clone(cmd), "--kernels", name), `--kernels: kernel set "` + name + `" cannot run`},
				tc{cmd[0] + "/env " + name + " unsupported", []string{kernels.EnvKernels + "=" + name}, cmd, kernels.EnvKernels + `: kernel set "` + name + `" cannot run`},
			)
		}
	}
	if len(supportedKernelSets()) == len(allKernelSets) {
		t.Logf("this CPU runs every kernel set (%s): no unsupported set to try", strings.Join(allKernelSets, ", "))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stderr := stokeProcess(t, c.env, time.Minute, c.args...)
			line := strings.TrimSuffix(stderr, "\n")
			if code != 1 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "stoke: ") || !strings.Contains(line, c.want) {
				t.Fatalf("exit %d, stderr %q: want exit 1 and one line \"stoke: …%s…\"", code, stderr, c.want)
			}
		})
	}
}

// TestEngineReportsKernels starts `stoke engine --blank` on each supported
// kernel set, chosen by --kernels and by STOKE_KERNELS, and checks it logs
// the set at startup and exports it as stoke_engine_kernels{set=…} 1.
func TestEngineReportsKernels(t *testing.T) {
	sets := supportedKernelSets()
	for _, name := range sets {
		// The flag overrides another set in the environment.
		other := sets[0]
		if other == name {
			other = sets[len(sets)-1]
		}
		for _, how := range []string{"flag", "env"} {
			t.Run(name+"/"+how, func(t *testing.T) {
				args, env := []string{"--kernels", name}, []string{kernels.EnvKernels + "=" + other}
				if how == "env" {
					args, env = nil, []string{kernels.EnvKernels + "=" + name}
				}
				metrics, log := engineMetrics(t, env, args...)
				want := `stoke_engine_kernels{set="` + name + `"} 1`
				if !slices.Contains(strings.Split(metrics, "\n"), want) {
					t.Errorf("/metrics lacks %s:\n%s", want, metrics)
				}
				if n := strings.Count(metrics, "stoke_engine_kernels{"); n != 1 {
					t.Errorf("/metrics has %d stoke_engine_kernels series, want 1:\n%s", n, metrics)
				}
				if !strings.Contains(log, "msg=kernels set="+name) {
					t.Errorf("log does not name the kernel set %s:\n%s", name, log)
				}
			})
		}
	}
	// With neither (an empty STOKE_KERNELS is unset), the engine uses the
	// fastest set this CPU runs.
	t.Run("default", func(t *testing.T) {
		metrics, _ := engineMetrics(t, []string{kernels.EnvKernels + "="})
		if want := `stoke_engine_kernels{set="` + sets[0] + `"} 1`; !slices.Contains(strings.Split(metrics, "\n"), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, metrics)
		}
	})
}

// engineMetrics runs `stoke engine --blank` with args and env until it
// serves /metrics, and returns that page and the engine's log so far.
func engineMetrics(t *testing.T, env []string, args ...string) (metrics, log string) {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], append([]string{"engine", "--blank", "--listen", addr}, args...)...)
	cmd.Env = append(append(os.Environ(), runMainEnv+"=1"), env...)
	logPath := filepath.Join(t.TempDir(), "engine.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	readLog := func() string {
		b, _ := os.ReadFile(logPath)
		return string(b)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			t.Error("stoke engine did not stop on SIGTERM")
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(b), readLog()
			}
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("stoke engine exited (%v) before serving /metrics:\n%s", err, readLog())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("stoke engine did not serve /metrics within 30s:\n%s", readLog())
		}
	}
}

// TestGenerateKernelsMatchGolden runs `stoke generate --kernels NAME` on
// every kernel set this CPU runs and checks each reproduces the golden
// greedy completions and reports the set it used.
func TestGenerateKernelsMatchGolden(t *testing.T) {
	cases, stories := testmodel.Golden(t), testmodel.Dir(t)
	for _, name := range supportedKernelSets() {
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				ids := make([]string, len(c.PromptIDs))
				for i, id := range c.PromptIDs {
					ids[i] = strconv.Itoa(int(id))
				}
				out, err := stoke(t, "generate", "--model", stories, "--kernels", name, "--threads", "2", "--prompt-ids", strings.Join(ids, ","),
					"--max-tokens", strconv.Itoa(len(c.Completion)), "--temperature", "0", "--ignore-eos", "--json")
				if err != nil {
					t.Fatalf("%s: %v\n%s", c.Name, err, out)
				}
				var res generateOutput
				if err := json.Unmarshal([]byte(out), &res); err != nil {
					t.Fatalf("%s: output is not one JSON object: %v\n%s", c.Name, err, out)
				}
				if res.Kernels != name {
					t.Errorf("%s: --json reports kernels %q, want %q", c.Name, res.Kernels, name)
				}
				if !slices.Equal(res.IDs, c.Completion) {
					t.Errorf("%s: ids %v\nwant %v", c.Name, res.IDs, c.Completion)
				}
			}
		})
	}
}
