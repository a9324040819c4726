package cudaexec

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stokehq/stoke/internal/dtype"
)

// TestModuleDeclaresEveryKernel checks the generated PTX names every
// kernel once, balances its braces and leaves no template marker.
func TestModuleDeclaresEveryKernel(t *testing.T) {
	src := Module()
	for _, name := range KernelNames() {
		if n := strings.Count(src, ".visible .entry "+name+"("); n != 1 {
			t.Errorf("kernel %s is declared %d times", name, n)
		}
	}
	if o, c := strings.Count(src, "{"), strings.Count(src, "}"); o != c {
		t.Errorf("%d opening braces, %d closing", o, c)
	}
	if strings.Contains(src, "$K") || strings.Contains(src, "%!") {
		t.Error("the PTX holds an unexpanded template marker or a bad format verb")
	}
	// Every label a branch names is defined in the same kernel.
	for _, k := range strings.Split(src, ".visible .entry ")[1:] {
		defined := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^(\w+):$`).FindAllStringSubmatch(k, -1) {
			if defined[m[1]] {
				t.Errorf("label %s defined twice", m[1])
			}
			defined[m[1]] = true
		}
		for _, m := range regexp.MustCompile(`bra (\w+);`).FindAllStringSubmatch(k, -1) {
			if !defined[m[1]] {
				t.Errorf("branch to undefined label %s", m[1])
			}
		}
	}
}

// TestFP8TableMatchesEngine checks the kernels' E4M3FN table against the
// engine's own conversion.
func TestFP8TableMatchesEngine(t *testing.T) {
	for i := range 256 {
		got := FP8Value(byte(i))
		want, err := dtype.ToFloat32(dtype.F8E4M3, []byte{byte(i)})
		if err != nil {
			t.Skipf("the engine's dtype package converts no single FP8 value: %v", err)
		}
		if math.IsNaN(float64(want[0])) != math.IsNaN(float64(got)) || (!math.IsNaN(float64(got)) && got != want[0]) {
			t.Errorf("fp8 0x%02x: table %v, engine %v", i, got, want[0])
		}
	}
}

// TestPTXAssembles assembles the module with ptxas for sm_90 (the H200)
// when CUDA's ptxas is installed (Debian's nvidia-cuda-toolkit), so that
// a syntax or type error in a kernel shows up without a GPU.
func TestPTXAssembles(t *testing.T) {
	ptxas, err := exec.LookPath("ptxas")
	if err != nil {
		for _, p := range []string{"/usr/lib/nvidia-cuda-toolkit/bin/ptxas", "/usr/local/cuda/bin/ptxas"} {
			if _, err := os.Stat(p); err == nil {
				ptxas = p
			}
		}
	}
	if ptxas == "" {
		t.Skip("no ptxas here (Debian: apt-get install nvidia-cuda-toolkit)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "stoke.ptx")
	if err := os.WriteFile(src, []byte(Module()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"sm_90", "sm_80"} {
		out, err := exec.Command(ptxas, "-v", "--gpu-name", arch, "-o", filepath.Join(dir, arch+".cubin"), src).CombinedOutput()
		if err != nil {
			t.Fatalf("ptxas --gpu-name %s: %v\n%s", arch, err, out)
		}
		if len(out) > 0 {
			t.Logf("ptxas %s: %s", arch, out)
		}
	}
}

// kernelParams parses the parameter types of every kernel in the module.
func kernelParams(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	entry := regexp.MustCompile(`(?s)\.visible \.entry (\w+)\((.*?)\)\n\{`)
	param := regexp.MustCompile(`\.param \.(\w+) (\w+)`)
	for _, m := range entry.FindAllStringSubmatch(Module(), -1) {
		var types []string
		for _, p := range param.FindAllStringSubmatch(m[2], -1) {
			types = append(types, p[1])
			if strings.Contains(m[0], "\n"+strings.TrimPrefix(p[2], m[1]+"_")+":") {
				t.Errorf("kernel %s: a label shares the name of parameter %s", m[1], p[2])
			}
		}
		out[m[1]] = types
	}
	return out
}

// TestArgsMatchKernels checks every argument builder against the
// parameters of the kernel it feeds: their number and types.
func TestArgsMatchKernels(t *testing.T) {
	params := kernelParams(t)
	m := &Matrix{Rows: 4, Cols: 256, BR: 128, BC: 128, SCols: 2}
	cases := map[string][]Arg{
		KernelEmbedF32:  EmbedArgs(1, 2, 3, 4),
		KernelEmbedBF16: EmbedArgs(1, 2, 3, 4),
		KernelRMSNorm:   RMSNormArgs(1, 2, 3, 4, 1e-5),
		KernelRope:      RopeArgs(1, 2, 3, 4, 5, 6),
		KernelKVStore:   KVStoreArgs(1, 2, 3, 4, 5, 6),
		KernelAttention: AttentionArgs(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0.5),
		KernelSiLUMul:   SiLUMulArgs(1, 2, 3),
		KernelAdd:       AddArgs(1, 2, 3),
		KernelGather:    GatherArgs(1, 2, 3, 4),
		KernelSGEMM:     SGEMMArgs(1, 2, 3, 4, 5, 6, 7),
	}
	for _, k := range WeightKinds {
		cases[KernelGEMV(k)] = GEMVArgs(1, 2, 3, 4, 5, m)
		cases[KernelGEMV4(k)] = GEMVArgs(1, 2, 3, 4, 5, m)
		if k != WeightF32 {
			cases[KernelDequant(k)] = DequantArgs(1, 2, 3, m, 0, 2)
		}
	}
	for _, name := range KernelNames() {
		args, ok := cases[name]
		if !ok {
			t.Errorf("kernel %s has no argument builder under test", name)
			continue
		}
		want := params[name]
		if len(args) != len(want) {
			t.Errorf("kernel %s takes %d parameters, its builder gives %d", name, len(want), len(args))
			continue
		}
		for i, a := range args {
			if a.Type != want[i] {
				t.Errorf("kernel %s parameter %d is .%s, the builder gives %s", name, i, want[i], a.Type)
			}
		}
	}
}
