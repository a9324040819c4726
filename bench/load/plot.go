package load

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The PNG's size, and the column of each panel that holds its legend.
const (
	plotWidth   = 11 * vg.Inch
	plotHeight  = 11 * vg.Inch
	plotDPI     = 100
	legendWidth = 2.7 * vg.Inch
)

// PlotSweep draws a sweep as a PNG of three panels stacked, against the
// load: the latency percentiles (TTFT p50, p90, p99, TPOT p50, p99, on a
// log scale, with the SLO's bounds), the request throughput and goodput
// (and the offered rate, for a rate sweep), and the output token
// throughput; the knee and the max-SLO point are marked on each, and each
// panel's legend stands to its right.
func PlotSweep(s Sweep) ([]byte, error) {
	if len(s.Points) == 0 {
		return nil, fmt.Errorf("plotting the sweep: it has no points")
	}
	panels := []*plot.Plot{latencyPanel(s), requestPanel(s), tokenPanel(s)}
	panels[0].Title.Text = fmt.Sprintf("%s: %s, %s in, %s out, SLO %s", s.URL, modelList(s.Models), s.InputTokens, s.OutputTokens, s.SLO)
	img := vgimg.NewWith(vgimg.UseWH(plotWidth, plotHeight), vgimg.UseDPI(plotDPI))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	rows := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		rows[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	plots := draw.Crop(dc, 0, -legendWidth, 0, 0)
	legends := draw.Crop(dc, plotWidth-legendWidth, 0, 0, 0)
	canvases := plot.Align(rows, tiles, plots)
	for i, p := range panels {
		legend := p.Legend
		p.Legend = plot.NewLegend()
		p.Draw(canvases[i][0])
		lc := tiles.At(legends, 0, i)
		lc.Min.Y = canvases[i][0].Min.Y
		lc.Max.Y = canvases[i][0].Max.Y - 2*vg.Millimeter
		if i == 0 {
			lc.Max.Y -= 6 * vg.Millimeter // below the title
		}
		legend.Draw(lc)
	}
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("plotting the sweep: %w", err)
	}
	return buf.Bytes(), nil
}

// modelList names a sweep's models.
func modelList(ms []SweepModel) string {
	out := ""
	for i, m := range ms {
		if i > 0 {
			out += ", "
		}
		out += m.Name
	}
	return out
}

// seriesColor is the i-th series' color.
func seriesColor(i int) color.Color {
	colors := [...]color.RGBA{
		{31, 119, 180, 255}, {255, 127, 14, 255}, {214, 39, 40, 255}, {44, 160, 44, 255},
		{148, 103, 189, 255}, {140, 86, 75, 255}, {127, 127, 127, 255},
	}
	return colors[i%len(colors)]
}

// series is one line of a panel: a value of each point (points whose value
// is NaN, or not positive on a log scale, are left out).
type series struct {
	name   string
	value  func(SweepPoint) float64
	dashed bool
	color  color.Color // default: the i-th series' color
}

// basePanel is a panel with the sweep's x axis, its lines and the knee and
// max-SLO markers.
func basePanel(s Sweep, ylabel string, logY bool, lines []series) *plot.Plot {
	p := plot.New()
	p.X.Label.Text = s.Param
	if s.Param == SweepRate {
		p.X.Label.Text = "offered rate (req/s)"
	}
	p.Y.Label.Text = ylabel
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.ThumbnailWidth = 0.45 * vg.Inch
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Legend.Padding = vg.Points(2)
	p.Add(plotter.NewGrid())
	lo, hi := math.Inf(1), math.Inf(-1)
	var ticks plot.ConstantTicks
	for _, pt := range s.Points {
		lo, hi = math.Min(lo, pt.Load), math.Max(hi, pt.Load)
		ticks = append(ticks, plot.Tick{Value: pt.Load, Label: strconv.FormatFloat(pt.Load, 'g', 4, 64)})
	}
	p.X.Tick.Marker = ticks
	if lo > 0 && hi/lo >= 8 {
		p.X.Scale = plot.LogScale{}
	}
	drawn := false
	for i, l := range lines {
		var xys plotter.XYs
		for _, pt := range s.Points {
			v := l.value(pt)
			if math.IsNaN(v) || math.IsInf(v, 0) || (logY && v <= 0) {
				continue
			}
			xys = append(xys, plotter.XY{X: pt.Load, Y: v})
		}
		if len(xys) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			continue
		}
		c := l.color
		if c == nil {
			c = seriesColor(i)
		}
		line.Color, points.Color = c, c
		line.Width = vg.Points(1.5)
		if l.dashed {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		points.Shape = draw.CircleGlyph{}
		points.Radius = vg.Points(2.5)
		p.Add(line, points)
		p.Legend.Add(l.name, line, points)
		drawn = true
	}
	if logY && drawn {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if !logY {
		p.Y.Min = 0
	}
	if s.Knee != nil {
		m := refLine{vertical: true, at: s.Knee.Load, style: draw.LineStyle{Color: color.Black, Width: vg.Points(1.3),
			Dashes: []vg.Length{vg.Points(7), vg.Points(3)}}}
		p.Add(m)
		p.Legend.Add(fmt.Sprintf("knee (%s=%g)", s.Param, s.Knee.Load), m)
	}
	if s.MaxSLO != nil {
		m := refLine{vertical: true, at: s.MaxSLO.Load, style: draw.LineStyle{Color: color.RGBA{0, 150, 136, 255}, Width: vg.Points(1.6),
			Dashes: []vg.Length{vg.Points(2), vg.Points(2)}}}
		p.Add(m)
		p.Legend.Add(fmt.Sprintf("max SLO (%s=%g, ≥%g%% met)", s.Param, s.MaxSLO.Load, 100*s.SLOTarget), m)
	}
	return p
}

// latencyPanel is the latency percentiles with the SLO's bounds.
func latencyPanel(s Sweep) *plot.Plot {
	p := basePanel(s, "latency (ms, log)", true, []series{
		{name: "TTFT p50", value: func(pt SweepPoint) float64 { return pt.TTFT.Median }},
		{name: "TTFT p90", value: func(pt SweepPoint) float64 { return pt.TTFT.P90 }},
		{name: "TTFT p99", value: func(pt SweepPoint) float64 { return pt.TTFT.P99 }},
		{name: "TPOT p50", value: func(pt SweepPoint) float64 { return pt.TPOT.Median }, dashed: true},
		{name: "TPOT p99", value: func(pt SweepPoint) float64 { return pt.TPOT.P99 }, dashed: true},
	})
	for _, b := range []struct {
		name string
		ms   float64
		c    color.Color
	}{{"TTFT SLO", s.SLO.TTFT, seriesColor(2)}, {"TPOT SLO", s.SLO.TPOT, seriesColor(4)}} {
		if b.ms <= 0 {
			continue
		}
		l := refLine{at: b.ms, style: draw.LineStyle{Color: b.c, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(1), vg.Points(2.5)}}}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s %g ms", b.name, b.ms), l)
	}
	return p
}

// requestPanel is the request throughput and goodput.
func requestPanel(s Sweep) *plot.Plot {
	lines := []series{
		{name: "request throughput (req/s)", value: func(pt SweepPoint) float64 { return pt.RequestRate }},
		{name: "goodput (req/s within the SLO)", value: func(pt SweepPoint) float64 { return pt.Goodput }},
	}
	if s.Param == SweepRate {
		lines = append(lines, series{name: "offered rate", value: func(pt SweepPoint) float64 { return pt.Load }, dashed: true,
			color: seriesColor(6)})
	}
	return basePanel(s, "requests / s", false, lines)
}

// tokenPanel is the output token throughput.
func tokenPanel(s Sweep) *plot.Plot {
	return basePanel(s, "output tokens / s", false, []series{
		{name: "output token throughput", value: func(pt SweepPoint) float64 { return pt.OutputThroughput }},
	})
}

// refLine is a line across a panel at a value of x (vertical) or y.
type refLine struct {
	vertical bool
	at       float64
	style    draw.LineStyle
}

// Plot draws the line (plot.Plotter).
func (l refLine) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	if l.vertical {
		x := trX(l.at)
		c.StrokeLine2(l.style, x, c.Min.Y, x, c.Max.Y)
		return
	}
	y := trY(l.at)
	c.StrokeLine2(l.style, c.Min.X, y, c.Max.X, y)
}

// DataRange keeps the line's value in the panel (plot.DataRanger).
func (l refLine) DataRange() (xmin, xmax, ymin, ymax float64) {
	inf := math.Inf(1)
	if l.vertical {
		return l.at, l.at, inf, -inf
	}
	return inf, -inf, l.at, l.at
}

// Thumbnail draws the line's legend entry (plot.Thumbnailer).
func (l refLine) Thumbnail(c *draw.Canvas) {
	y := c.Center().Y
	c.StrokeLine2(l.style, c.Min.X, y, c.Max.X, y)
}
