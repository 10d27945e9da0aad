package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The gateway connection-rate row's plot (--plots, gateway-cps.svg): new connections per second of
// each path as bars, the median over rounds, each labelled with its CPU time per connection.

// gwCPSPlot is what the plot shows, one entry per path in the row's order.
type gwCPSPlot struct {
	names      []string
	rates      []float64 // conn/s
	cpuPerConn []float64 // ns
}

// cpsPlotData takes the medians of the row's samples.
func cpsPlotData(names []string, samples map[string][]cpsSample) *gwCPSPlot {
	p := &gwCPSPlot{}
	for _, n := range names {
		ss := samples[n]
		if len(ss) == 0 {
			continue
		}
		p.names = append(p.names, n)
		p.rates = append(p.rates, median(pickSamples(ss, func(s cpsSample) float64 { return s.rate })))
		p.cpuPerConn = append(p.cpuPerConn, median(pickSamples(ss, func(s cpsSample) float64 { return s.cpuPerConn })))
	}
	return p
}

// shortLabel is a path's name under its bar.
func shortLabel(name string) string {
	switch {
	case name == "ceiling":
		return "no gateway"
	case name == "haproxy":
		return "HAProxy"
	case strings.HasSuffix(name, "+fastPath"):
		return strings.TrimSuffix(name, "+fastPath") + " BPF"
	case name == "nodePort" || name == "direct":
		return name + " nft"
	}
	return name
}

// draw writes gateway-cps.svg into dir.
func (g *gwCPSPlot) draw(dir, date string) (string, error) {
	if len(g.names) == 0 {
		return "", nil
	}
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	p := plot.New()
	p.Title.Text = "New TCP connections per second through the gateway namespace\n(test/bench --only gateway-cps, " + date + "; same machine, same run; bar label: CPU µs per connection)"
	p.Y.Label.Text = "connections/s"
	labels := make([]string, len(g.names))
	for i, n := range g.names {
		labels[i] = shortLabel(n)
	}
	bars, err := plotter.NewBarChart(plotter.Values(g.rates), vg.Points(28))
	if err != nil {
		return "", err
	}
	bars.Color = curveColor("vipgate")
	p.Add(plotter.NewGrid(), bars)
	p.NominalX(labels...)
	p.Y.Min = 0
	p.X.Min, p.X.Max = -0.6, float64(len(g.names))-0.4 // room for the last bar's label
	var xys plotter.XYs
	var texts []string
	for i, r := range g.rates {
		xys = append(xys, plotter.XY{X: float64(i), Y: r})
		texts = append(texts, fmt.Sprintf("%.0f µs", g.cpuPerConn[i]/1e3))
	}
	lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return "", err
	}
	for i := range lbl.TextStyle {
		lbl.TextStyle[i].Font = font.Font{Typeface: "Liberation", Variant: "Sans", Size: vg.Points(9)}
		lbl.TextStyle[i].XAlign = -0.5
		lbl.TextStyle[i].YAlign = 0
	}
	p.Add(lbl)
	file := filepath.Join(dir, "gateway-cps.svg")
	if err := p.Save(22*vg.Centimeter, 12*vg.Centimeter, file); err != nil {
		return "", fmt.Errorf("writing %s: %w", file, err)
	}
	return file, nil
}
