package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The scaling curves of one run, drawn with gonum/plot as SVG next to BENCH.md (--plots): full
// sync time and memory against the number of Services, for vipgate, kube-proxy and the kernel floor
// (`nft -f` of vipgate's rules). Both axes are logarithmic: the sizes span 30x and the times 100x and
// more, and a straight line of slope 1 is linear scaling.

// plotKind is one of the drawn plots.
type plotKind int

const (
	plotSync plotKind = iota // full sync time, seconds
	plotPeak                 // memory, MiB
	numPlots
)

// plotSpec is the fixed part of each plot.
var plotSpecs = [numPlots]struct {
	file, title, yLabel string
	unit                func(float64) string
}{
	plotSync: {"full-sync.svg", "First (full) sync of N Services x 10 endpoints into the kernel", "time (log scale)", fmtSeconds},
	plotPeak: {"memory.svg", "Memory of the process holding N Services x 10 endpoints",
		"MiB (log scale)", func(v float64) string { return trimFloat(v) + " MiB" }},
}

// curve is one line of a plot: a name and its points, in the order measured.
type curve struct {
	name   string
	xs, ys []float64
}

// scaling collects the curves while the run measures.
type scaling struct {
	curves [numPlots][]*curve
}

// add records the point (n Services, y) of the named curve.
func (s *scaling) add(kind plotKind, name string, n int, y float64) {
	if y <= 0 { // a log scale has no room for it (and nothing was measured)
		return
	}
	i := slices.IndexFunc(s.curves[kind], func(c *curve) bool { return c.name == name })
	if i < 0 {
		s.curves[kind] = append(s.curves[kind], &curve{name: name})
		i = len(s.curves[kind]) - 1
	}
	c := s.curves[kind][i]
	c.xs, c.ys = append(c.xs, float64(n)), append(c.ys, y)
}

// draw writes each plot that has points into dir and returns the files written.
func (s *scaling) draw(dir, date string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	var files []string
	for kind := plotKind(0); kind < numPlots; kind++ {
		if len(s.curves[kind]) == 0 {
			continue
		}
		p, err := s.plot(kind, date)
		if err != nil {
			return files, err
		}
		file := filepath.Join(dir, plotSpecs[kind].file)
		if err := p.Save(20*vg.Centimeter, 12*vg.Centimeter, file); err != nil {
			return files, fmt.Errorf("writing %s: %w", file, err)
		}
		files = append(files, file)
	}
	return files, nil
}

func (s *scaling) plot(kind plotKind, date string) (*plot.Plot, error) {
	spec := plotSpecs[kind]
	p := plot.New()
	p.Title.Text = spec.title + "\n(test/bench, " + date + "; same machine, same run, same Services)"
	p.X.Label.Text = "Services (log scale)"
	p.Y.Label.Text = spec.yLabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())

	var sizes, ys []float64
	for _, c := range s.curves[kind] {
		sizes, ys = append(sizes, c.xs...), append(ys, c.ys...)
	}
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	var xt plot.ConstantTicks
	for _, n := range sizes {
		xt = append(xt, plot.Tick{Value: n, Label: shortCount(n)})
	}
	p.X.Tick.Marker = xt
	p.X.Min, p.X.Max = sizes[0]/1.25, sizes[len(sizes)-1]*1.25
	p.Y.Min, p.Y.Max = niceBelow(slices.Min(ys)), niceAbove(slices.Max(ys))
	if p.Y.Max <= p.Y.Min { // one value, itself a 1-2-5 value: gonum would widen the range past 0
		p.Y.Min, p.Y.Max = p.Y.Min/2, p.Y.Max*2
	}
	p.Y.Tick.Marker = logTicks{spec.unit}

	for _, c := range s.curves[kind] {
		xys := make(plotter.XYs, len(c.xs))
		for i := range c.xs {
			xys[i] = plotter.XY{X: c.xs[i], Y: c.ys[i]}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("curve %s: %w", c.name, err)
		}
		col := curveColor(c.name)
		line.Color, points.Color = col, col
		line.Width = vg.Points(1.5)
		points.Shape = draw.CircleGlyph{}
		if strings.HasSuffix(c.name, "RSS after") || strings.HasPrefix(c.name, "nft") {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(line, points)
		p.Legend.Add(c.name, line, points)
	}
	return p, nil
}

// curveColor keeps one colour per implementation across the plots.
func curveColor(name string) color.Color {
	switch {
	case strings.HasPrefix(name, "vipgate"):
		return color.RGBA{R: 0x1f, G: 0x63, B: 0xc6, A: 0xff} // blue
	case strings.HasPrefix(name, "kube-proxy v1.36"):
		return color.RGBA{R: 0xe6, G: 0x8a, B: 0x00, A: 0xff} // orange
	case strings.HasPrefix(name, "kube-proxy"):
		return color.RGBA{R: 0xc6, G: 0x28, B: 0x28, A: 0xff} // red
	default:
		return color.RGBA{R: 0x70, G: 0x70, B: 0x70, A: 0xff} // grey: the kernel floor
	}
}

// logTicks labels a logarithmic axis at 1, 2 and 5 times each power of ten, with minor ticks
// between (plot.LogTicks labels the powers of ten only, too few for a range under 100x).
type logTicks struct{ label func(float64) string }

func (t logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for m := 1; m < 10; m++ {
			v := float64(m) * math.Pow(10, e)
			if v < lo*0.999 || v > hi*1.001 {
				continue
			}
			tick := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				tick.Label = t.label(v)
			}
			ticks = append(ticks, tick)
		}
	}
	return ticks
}

// niceBelow and niceAbove widen a range to the next 1-2-5 values around it.
func niceBelow(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{5, 2, 1} {
		if m*e <= v {
			return m * e
		}
	}
	return e
}

func niceAbove(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

// fmtSeconds labels a time axis: 20 ms, 500 ms, 1 s, 20 s.
func fmtSeconds(s float64) string {
	if s < 1 {
		return trimFloat(s*1000) + " ms"
	}
	return trimFloat(s) + " s"
}

// trimFloat prints a tick value without trailing zeros: 0.5, 2, 100.
func trimFloat(v float64) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

// shortCount labels a Service count: 1k, 3k, 10k, 100k.
func shortCount(n float64) string {
	if n >= 1000 && math.Mod(n, 1000) == 0 {
		return fmt.Sprintf("%.0fk", n/1000)
	}
	return fmt.Sprintf("%.0f", n)
}
