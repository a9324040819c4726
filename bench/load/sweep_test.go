package load

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// pt is a scripted sweep point: its load, p99 TTFT, completed and failed
// requests and SLO attainment.
func pt(load, p99 float64, completed, failed int, attainment float64) SweepPoint {
	return PointOf(load, Report{Completed: completed, Failed: failed, SLOAttainment: attainment, TTFT: Stats{P99: p99}})
}

func TestKnee(t *testing.T) {
	for _, tc := range []struct {
		name   string
		points []SweepPoint
		factor float64
		want   int
	}{
		{"none", nil, 1.5, -1},
		{"the last within 1.5×", []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 120, 50, 0, 1), pt(4, 149, 50, 0, 1), pt(8, 151, 50, 0, 1), pt(16, 900, 50, 0, 1)}, 1.5, 2},
		{"exactly 1.5× is within", []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 150, 50, 0, 1), pt(4, 400, 50, 0, 1)}, 1.5, 1},
		{"a wider factor", []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 150, 50, 0, 1), pt(4, 190, 50, 0, 1), pt(8, 400, 50, 0, 1)}, 2, 2},
		{"all within", []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 101, 50, 0, 1)}, 1.5, 1},
		{"only the baseline", []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 300, 50, 0, 1)}, 1.5, 0},
		{"in any order, by load", []SweepPoint{pt(8, 900, 50, 0, 1), pt(1, 100, 50, 0, 1), pt(4, 140, 50, 0, 1), pt(2, 110, 50, 0, 1)}, 1.5, 2},
		{"the highest within, past a blip", []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 160, 50, 0, 1), pt(4, 140, 50, 0, 1), pt(8, 500, 50, 0, 1)}, 1.5, 2},
		{"a baseline that completed none", []SweepPoint{pt(1, 0, 0, 10, 0), pt(2, 100, 50, 0, 1)}, 1.5, -1},
		{"a baseline past 1% failed", []SweepPoint{pt(1, 100, 98, 2, 1), pt(2, 100, 50, 0, 1)}, 1.5, -1},
		{"1% failed still has a p99", []SweepPoint{pt(1, 100, 99, 1, 1), pt(2, 100, 99, 1, 1)}, 1.5, 1},
		{"a shedding point is past the knee", []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 110, 50, 0, 1), pt(4, 90, 10, 40, 0.2)}, 1.5, 1},
		{"a point that completed none is past it", []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 110, 50, 0, 1), pt(4, 0, 0, 0, 0)}, 1.5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Knee(tc.points, tc.factor); got != tc.want {
				t.Fatalf("knee %d, want %d", got, tc.want)
			}
		})
	}
}

func TestMaxSLO(t *testing.T) {
	for _, tc := range []struct {
		name   string
		points []SweepPoint
		target float64
		want   int
	}{
		{"none", nil, 0.9, -1},
		{"the last at 90%", []SweepPoint{pt(1, 1, 50, 0, 1), pt(2, 1, 50, 0, 0.95), pt(4, 1, 50, 0, 0.9), pt(8, 1, 50, 0, 0.89), pt(16, 1, 50, 0, 0.3)}, 0.9, 2},
		{"a higher target", []SweepPoint{pt(1, 1, 50, 0, 1), pt(2, 1, 50, 0, 0.95), pt(4, 1, 50, 0, 0.9)}, 0.95, 1},
		{"not even the first", []SweepPoint{pt(1, 1, 50, 0, 0.8), pt(2, 1, 50, 0, 0.5)}, 0.9, -1},
		{"all of them", []SweepPoint{pt(1, 1, 50, 0, 1), pt(2, 1, 50, 0, 0.99)}, 0.9, 1},
		{"in any order, by load", []SweepPoint{pt(16, 1, 50, 0, 0.2), pt(2, 1, 50, 0, 0.97), pt(1, 1, 50, 0, 1), pt(4, 1, 50, 0, 0.6)}, 0.9, 1},
		{"the highest, past a dip", []SweepPoint{pt(1, 1, 50, 0, 1), pt(2, 1, 50, 0, 0.85), pt(4, 1, 50, 0, 0.92), pt(8, 1, 50, 0, 0.4)}, 0.9, 2},
		{"a point that completed none", []SweepPoint{pt(1, 1, 50, 0, 1), pt(2, 0, 0, 0, 1)}, 0.9, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MaxSLO(tc.points, tc.target); got != tc.want {
				t.Fatalf("max-SLO point %d, want %d", got, tc.want)
			}
		})
	}
}

func TestAnalyzeMarks(t *testing.T) {
	s := Sweep{Param: SweepRate, Points: []SweepPoint{pt(1, 100, 50, 0, 1), pt(2, 140, 50, 0, 0.95), pt(4, 400, 50, 0, 0.5)}}
	s.Points[1].Goodput, s.Points[1].RequestRate = 1.9, 2
	s.Analyze()
	if s.KneeFactor != 1.5 || s.SLOTarget != 0.9 || s.BaselineTTFTP99 != 100 {
		t.Fatalf("factor %v, target %v, baseline %v", s.KneeFactor, s.SLOTarget, s.BaselineTTFTP99)
	}
	want := SweepMark{Index: 1, Load: 2, RequestRate: 2, Goodput: 1.9, SLOAttainment: 0.95, TTFTP99: 140}
	if s.Knee == nil || *s.Knee != want || s.MaxSLO == nil || *s.MaxSLO != want {
		t.Fatalf("knee %+v, max SLO %+v, want both %+v", s.Knee, s.MaxSLO, want)
	}
	if line := s.KneeLine(); !strings.Contains(line, "rate=2") || !strings.Contains(line, "140.0 ms") {
		t.Errorf("knee line %q", line)
	}
	s.Points = s.Points[2:]
	s.Points[0].SLOAttainment = 0.1
	s.Analyze()
	if s.Knee == nil || s.Knee.Index != 0 || s.MaxSLO != nil || !strings.HasPrefix(s.MaxSLOLine(), "max SLO: none") {
		t.Fatalf("knee %+v, max SLO %+v (%s)", s.Knee, s.MaxSLO, s.MaxSLOLine())
	}
}

func TestParseSweep(t *testing.T) {
	for _, tc := range []struct {
		in     string
		param  string
		values []float64
	}{
		{"rate=1,2,4,8", SweepRate, []float64{1, 2, 4, 8}},
		{"rate=8, 0.5 ,2", SweepRate, []float64{0.5, 2, 8}},
		{"concurrency=1,4,16,64", SweepConcurrency, []float64{1, 4, 16, 64}},
	} {
		param, values, err := ParseSweep(tc.in)
		if err != nil || param != tc.param || !slices.Equal(values, tc.values) {
			t.Errorf("%q: %s %v %v, want %s %v", tc.in, param, values, err, tc.param, tc.values)
		}
	}
	for _, bad := range []string{"", "rate", "rate=", "qps=1,2", "rate=1,x", "rate=0,1", "rate=-1", "rate=1,1", "concurrency=1.5", "rate=Inf"} {
		if p, v, err := ParseSweep(bad); err == nil {
			t.Errorf("%q parsed as %s %v", bad, p, v)
		}
	}
}

// TestRunSweepWritesFiles: a sweep against a streaming server runs a
// point a value with the right load, and its files read back: the JSON
// through ReadSweep, the PNG as an image, the page with its table and the
// plot inside.
func TestRunSweepWritesFiles(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	mix, _ := ParseMix("a=3,b=1")
	var rates []float64
	so := SweepOptions{
		Load:   Options{URL: srv.URL, Models: mix, Requests: 12, Input: fixed(t, "uniform:4-8"), Output: fixed(t, "3"), Seed: 9, PrefixTokens: 10},
		Param:  SweepRate,
		Values: []float64{400, 100, 200},
		Pause:  time.Millisecond,
		SLO:    SLO{TTFT: 5 * time.Second, TPOT: time.Second},
		Point: func(i int, o *Options) func() {
			rates = append(rates, o.Rate)
			return func() {}
		},
		Command: "stoke bench load --sweep=rate=100,200,400",
	}
	s, err := RunSweep(context.Background(), so)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rates, []float64{100, 200, 400}) || len(s.Points) != 3 || len(rec.asked) != 36 {
		t.Fatalf("ran rates %v, %d points, %d requests: want 100, 200, 400 with 12 requests each", rates, len(s.Points), len(rec.asked))
	}
	for i, p := range s.Points {
		if p.Load != []float64{100, 200, 400}[i] || p.Completed != 12 || p.SLOAttainment != 1 || p.Report.Models["a"].Completed+p.Report.Models["b"].Completed != 12 {
			t.Fatalf("point %d: %+v", i, p)
		}
	}
	if s.Version != 1 || s.URL != srv.URL || s.InputTokens != "uniform:4-8" || s.InputTokensMean != 16 || s.OutputTokensMean != 3 ||
		s.PrefixGroups != 1 || s.SLO != (SweepSLO{TTFT: 5000, TPOT: 1000}) || s.Burstiness != 1 ||
		!slices.Equal(s.Models, []SweepModel{{"a", 0.75}, {"b", 0.25}}) || s.Knee == nil || s.MaxSLO == nil || s.MaxSLO.Index != 2 {
		t.Fatalf("sweep %+v", s)
	}

	dir := filepath.Join(t.TempDir(), "out")
	if err := WriteSweepFiles(dir, s); err != nil {
		t.Fatal(err)
	}
	back, err := ReadSweep(filepath.Join(dir, SweepJSONFile))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(s)
	b, _ := json.Marshal(back)
	if !bytes.Equal(a, b) {
		t.Fatalf("sweep.json reads back as\n%s\nwant\n%s", b, a)
	}
	data, err := os.ReadFile(filepath.Join(dir, SweepPNGFile))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("sweep.png: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1100 || b.Dy() != 1100 {
		t.Fatalf("sweep.png is %v, want 1100×1100", b)
	}
	page, err := os.ReadFile(filepath.Join(dir, SweepHTMLFile))
	if err != nil {
		t.Fatal(err)
	}
	html := string(page)
	for _, want := range []string{`<table id="points">`, "data:image/png;base64,", "stoke bench load --sweep=rate=100,200,400", s.KneeLine(), `<table id="models">`} {
		if !strings.Contains(html, want) {
			t.Errorf("sweep.html lacks %q", want)
		}
	}
	if rows := strings.Count(html, "<tr class="); rows != 3 {
		t.Errorf("sweep.html has %d point rows, want 3", rows)
	}
}

func TestReadSweepErrors(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"bad.json":   `{"version": 1,`,
		"newer.json": `{"version": 2, "param": "rate"}`,
		"param.json": `{"version": 1, "param": "qps"}`,
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadSweep(path); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v, want one naming the file", name, err)
		}
	}
	if _, err := ReadSweep(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing sweep read")
	}
}

func TestRunSweepRefusesATrace(t *testing.T) {
	_, err := RunSweep(context.Background(), SweepOptions{Load: Options{Trace: []TraceEntry{{}}}, Param: SweepRate, Values: []float64{1}})
	if err == nil {
		t.Fatal("a trace swept")
	}
}
