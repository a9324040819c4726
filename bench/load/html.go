package load

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// The files WriteSweepFiles writes in its folder.
const (
	SweepJSONFile = "sweep.json"
	SweepPNGFile  = "sweep.png"
	SweepHTMLFile = "sweep.html"
)

// WriteSweepFiles writes a sweep into dir (made if need be): sweep.json
// (the Sweep, as ReadSweep reads it), sweep.png (PlotSweep) and
// sweep.html (WriteSweepHTML, the PNG inside it).
func WriteSweepFiles(dir string, s Sweep) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing the sweep: %w", err)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("writing the sweep: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, SweepJSONFile), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the sweep: %w", err)
	}
	png, err := PlotSweep(s)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, SweepPNGFile), png, 0o644); err != nil {
		return fmt.Errorf("writing the sweep's plot: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, SweepHTMLFile))
	if err != nil {
		return fmt.Errorf("writing the sweep's page: %w", err)
	}
	if err := WriteSweepHTML(f, s, png); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing the sweep's page: %w", err)
	}
	return nil
}

// WriteSweepHTML writes a self-contained page of the sweep: its
// parameters, the knee and max-SLO lines, a table of its points, and png
// (PlotSweep's) inside as a data URI.
func WriteSweepHTML(w io.Writer, s Sweep, png []byte) error {
	t, err := template.New("sweep").Funcs(template.FuncMap{
		"pct": func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
		"f1":  func(f float64) string { return fmt.Sprintf("%.1f", f) },
		"f2":  func(f float64) string { return fmt.Sprintf("%.2f", f) },
		"is":  func(m *SweepMark, i int) bool { return m != nil && m.Index == i },
	}).Parse(sweepPage)
	if err != nil {
		return fmt.Errorf("writing the sweep's page: %w", err)
	}
	var names []string
	for _, p := range s.Points {
		for m := range p.Report.Models {
			if !slices.Contains(names, m) {
				names = append(names, m)
			}
		}
	}
	slices.Sort(names)
	data := struct {
		Sweep
		KneeText, MaxSLOText string
		Image                template.URL
		ModelNames           []string
	}{s, s.KneeLine(), s.MaxSLOLine(), template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(png)), names}
	if len(names) < 2 {
		data.ModelNames = nil
	}
	if err := t.Execute(w, data); err != nil {
		return fmt.Errorf("writing the sweep's page: %w", err)
	}
	return nil
}

// sweepPage is the template of sweep.html.
const sweepPage = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>stoke bench load sweep: {{.URL}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; }
table.params td, table.params th { text-align: left; }
tr.knee td { background: #fde8e8; }
tr.maxslo td { background: #e6f5e6; }
tr.knee.maxslo td { background: #f3efd9; }
code { background: #f6f6f6; padding: 0 0.2em; }
img { max-width: 100%; border: 1px solid #ddd; }
</style>
</head>
<body>
<h1>Load sweep of {{.URL}}</h1>
<p>Started {{.Created.Format "2006-01-02 15:04:05 MST"}}{{if .Command}}: <code>{{.Command}}</code>{{end}}</p>
<h2>Parameters</h2>
<table class="params" id="params">
<tr><th>target</th><td>{{.URL}}</td></tr>
<tr><th>models</th><td>{{range $i, $m := .Models}}{{if $i}}, {{end}}{{$m.Name}} ({{pct $m.Share}}){{end}}</td></tr>
<tr><th>swept</th><td>{{.Param}}{{if eq .Param "rate"}} (open loop, burstiness {{.Burstiness}}){{else}} (closed loop){{end}}</td></tr>
<tr><th>each point</th><td>{{if .DurationSeconds}}{{.DurationSeconds}} s{{end}}{{if .Requests}}{{if .DurationSeconds}}, {{end}}at most {{.Requests}} requests{{end}}</td></tr>
<tr><th>input tokens</th><td>{{.InputTokens}} (mean prompt {{f1 .InputTokensMean}}{{if .PrefixTokens}}, shared prefix included{{end}})</td></tr>
<tr><th>output tokens</th><td>{{.OutputTokens}} (mean {{f1 .OutputTokensMean}})</td></tr>
{{if .PrefixTokens}}<tr><th>shared prefix</th><td>{{.PrefixTokens}} tokens, {{.PrefixGroups}} groups</td></tr>
{{end}}<tr><th>SLO</th><td>{{.SLO}} (target: {{pct .SLOTarget}} of requests)</td></tr>
<tr><th>knee bound</th><td>p99 TTFT ≤ {{.KneeFactor}} × {{f1 .BaselineTTFTP99}} ms (the lowest load's)</td></tr>
<tr><th>seed</th><td>{{if .Seed}}{{.Seed}}{{else}}random{{end}}</td></tr>
</table>
<h2>Findings</h2>
<p id="knee">{{.KneeText}}</p>
<p id="maxslo">{{.MaxSLOText}}</p>
<h2>Points</h2>
<table id="points">
<tr><th>{{.Param}}</th><th>req/s</th><th>out tok/s</th><th>TTFT p50</th><th>TTFT p90</th><th>TTFT p99</th><th>TPOT p50</th><th>TPOT p99</th><th>ITL p50</th><th>E2E p50</th><th>E2E p99</th><th>SLO met</th><th>goodput (req/s)</th><th>completed</th><th>failed</th></tr>
{{range $i, $p := .Points}}<tr class="{{if is $.Knee $i}}knee {{end}}{{if is $.MaxSLO $i}}maxslo{{end}}"><td>{{$p.Load}}</td><td>{{f2 $p.RequestRate}}</td><td>{{f1 $p.OutputThroughput}}</td><td>{{f1 $p.TTFT.Median}}</td><td>{{f1 $p.TTFT.P90}}</td><td>{{f1 $p.TTFT.P99}}</td><td>{{f2 $p.TPOT.Median}}</td><td>{{f2 $p.TPOT.P99}}</td><td>{{f2 $p.ITL.Median}}</td><td>{{f1 $p.E2E.Median}}</td><td>{{f1 $p.E2E.P99}}</td><td>{{pct $p.SLOAttainment}}</td><td>{{f2 $p.Goodput}}</td><td>{{$p.Completed}}</td><td>{{$p.Failed}}</td></tr>
{{end}}</table>
<p>Latencies in milliseconds. Red: the knee; green: the max-SLO point.</p>
{{if .ModelNames}}<h2>By model</h2>
<table id="models">
<tr><th>{{.Param}}</th><th>model</th><th>completed</th><th>failed</th><th>req/s</th><th>TTFT p50</th><th>TTFT p99</th><th>TPOT p50</th><th>SLO met</th></tr>
{{range $p := .Points}}{{range $name := $.ModelNames}}{{with index $p.Report.Models $name}}<tr><td>{{$p.Load}}</td><td>{{$name}}</td><td>{{.Completed}}</td><td>{{.Failed}}</td><td>{{f2 .RequestThroughput}}</td><td>{{f1 .TTFT.Median}}</td><td>{{f1 .TTFT.P99}}</td><td>{{f2 .TPOT.Median}}</td><td>{{pct .SLOAttainment}}</td></tr>
{{end}}{{end}}{{end}}</table>
{{end}}<h2>Plot</h2>
<img alt="latency, throughput and goodput against {{.Param}}" src="{{.Image}}">
</body>
</html>
`
